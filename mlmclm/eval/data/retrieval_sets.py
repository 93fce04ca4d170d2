"""EncodEval's retrieval evaluation sets (encodeval/datasets.py msmarco(), nq(), mldr_en()), built from the
sources' own ids:

- BEIR sets (MS MARCO, NQ): the corpus is every document judged in either split's qrels, **score 0 included**; a
  document is relevant to a query when its score is >= 1; a query without a relevant document is not evaluated.
  NQ's documents read "{title}. {text}", MS MARCO's are their text.
- MLDR-en: the corpus is the positive passages of dev and test (their text from the `corpus` config); negatives
  are never used.
- Documents are keyed by id: two ids with the same text are two documents.
Rows: {"id", "query", "positive_ids", "positives"} per evaluated query, in the order the source lists them. The
corpus is in EncodEval's order too: each document where it is first judged, validation before test (its
`corpus_sub`), so that its evaluation's batches of 4 documents are EncodEval's.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from mlmclm.eval.data.data_files import MAX_ROW_CHARS, read_parquet_table
from mlmclm.eval.data.hub_files import HubLayoutError, matching_files

Reader = Callable[[set[str]], dict[str, str]]  # ids -> {id: text}


def document_text(row: dict[str, Any], columns: tuple[str, ...]) -> str:
    if columns == ("title", "text"):
        return f"{row['title']}. {row['text']}"  # EncodEval's NQ document
    return row[columns[0]]


def filtered_shard(path: Path, id_column: str, ids: set[str]):
    """The rows of one parquet shard whose `id_column` is in `ids` (a pyarrow Table; read whole shards, filtered
    in arrow, so an 8.8 M-document corpus never becomes Python objects)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    table = read_parquet_table(path)
    if id_column not in table.column_names:
        raise HubLayoutError(f"{path}: no column {id_column!r} (have {table.column_names})")
    column = pc.cast(table[id_column], "string")
    return table.filter(pc.is_in(column, value_set=pa.array(sorted(ids), type="string")))


def read_documents(folder: Path, pattern: str, id_column: str, ids: Iterable[str],
                   columns: tuple[str, ...]) -> dict[str, str]:
    """id -> text of the wanted ids found in the shards matching `pattern`."""
    wanted = set(ids)
    out: dict[str, str] = {}
    for path in matching_files(folder, pattern):
        for row in filtered_shard(path, id_column, wanted).to_pylist():
            text = document_text(row, columns)
            if len(text) > MAX_ROW_CHARS:  # as a row's text is bounded (data_files.py)
                raise HubLayoutError(f"{path}: document {row[id_column]!r} holds {len(text):,} characters, more "
                                     f"than the {MAX_ROW_CHARS:,} a document may hold; refusing to hold it")
            out[str(row[id_column])] = text
    missing = wanted - set(out)
    if missing:
        raise HubLayoutError(f"{folder} [{pattern}]: {len(missing)} id(s) judged but absent, e.g. "
                             f"{sorted(missing)[:3]}")
    return out


def _row(query_id: str, query: str, positive_ids: list[str], corpus: dict[str, str]) -> dict[str, Any]:
    return {"id": query_id, "query": query, "positive_ids": positive_ids,
            "positives": [corpus[doc] for doc in positive_ids]}


def beir_sets(qrels: dict[str, list[tuple[str, str, int]]], read_queries: Reader, read_corpus: Reader
              ) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """(rows per split, corpus) of a BEIR set from its qrels per split."""
    judged = dict.fromkeys(doc for judgements in qrels.values() for _, doc, _ in judgements)  # first judged first
    found = read_corpus(set(judged))
    corpus = {doc: found[doc] for doc in judged}
    queries = read_queries({query for judgements in qrels.values() for query, _, _ in judgements})
    rows = {}
    for split, judgements in qrels.items():
        relevant: dict[str, list[str]] = {}
        for query, doc, score in judgements:
            if score >= 1:
                relevant.setdefault(query, []).append(doc)
        rows[split] = [_row(query, queries[query], docs, corpus) for query, docs in relevant.items()]
    return rows, corpus


def mldr_ids(judged: dict[str, list[dict]]) -> set[str]:
    return {passage["docid"] for rows in judged.values() for row in rows for passage in row["positive_passages"]}


def mldr_sets(judged: dict[str, list[dict]], read_corpus: Reader) -> tuple[dict[str, list[dict]], dict[str, str]]:
    """(rows per split, corpus) of MLDR from its dev/test rows (query_id, query, positive_passages)."""
    found = read_corpus(mldr_ids(judged))
    order = (p["docid"] for rows in judged.values() for row in rows for p in row["positive_passages"])
    corpus = {doc: found[doc] for doc in dict.fromkeys(order)}  # first judged first, as EncodEval's corpus_sub
    rows = {split: [_row(str(r["query_id"]), r["query"], [p["docid"] for p in r["positive_passages"]], corpus)
                    for r in split_rows if r["positive_passages"]]
            for split, split_rows in judged.items()}
    return rows, corpus
