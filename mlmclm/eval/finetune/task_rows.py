"""A task's rows as read from their source — local JSONL/parquet files, a `datasets` name, or a paper source
(data/sources.py) — each with where it came from, then checked against the family's schema (task_spec.py) and
normalised. Which source split each of our splits is read from depends on the split protocol."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlmclm.eval.data.data_files import (JSON_ESCAPE_FACTOR, MAX_ROW_CHARS, open_data_text, read_parquet_table,
                                         text_chars)
from mlmclm.eval.data.hub_files import tag_names
from mlmclm.eval.finetune.tags import TagError, check_tags
from mlmclm.eval.finetune.task_spec import SPLITS, TaskDataError, TaskSpec


@dataclass
class SourceRows:
    """The rows of one source split, each with where it came from (1-based: `file:line`, `file row n`), so every
    error about a row points at the line to fix."""

    source: str  # the file, or `hf:name [split]`, or `repo@revision [glob]`
    rows: list[dict[str, Any]]
    locations: list[str]
    label_names: list[str] | None = None  # the dataset's own tag names, in its id order (ClassLabel)
    corpus: dict[str, str] | None = None  # id-keyed retrieval corpus shared by the set's splits


def too_long(where: str, chars: int | None, limit: int) -> TaskDataError:
    size = f"{chars:,} characters" if chars is not None else "more characters"
    return TaskDataError(f"{where}: a row of {size} of text, more than the {limit:,} a row may hold; refusing to "
                         f"hold it (cut the row, or raise the task's max_row_chars)")


def _read_jsonl(path: Path, max_chars: int = MAX_ROW_CHARS) -> SourceRows:
    rows, locations = [], []
    line_limit = JSON_ESCAPE_FACTOR * max_chars + 4096
    with open_data_text(path, "task data file") as handle:
        # readline's limit: a line without an end is never read whole
        for number, line in enumerate(iter(lambda: handle.readline(line_limit + 1), ""), start=1):
            if len(line) > line_limit:
                raise too_long(f"{path}:{number}", None, max_chars)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise TaskDataError(f"{path}:{number}: invalid JSON ({err.msg})") from err
            if not isinstance(row, dict):
                raise TaskDataError(f"{path}:{number}: expected a JSON object per line")
            rows.append(row)
            locations.append(f"{path}:{number}")
    return SourceRows(str(path), rows, locations)


def _numbered(source: str, rows: list[dict[str, Any]]) -> SourceRows:
    return SourceRows(source, rows, [f"{source} row {number}" for number in range(1, len(rows) + 1)])


def read_local_split(folder: Path, split: str, max_chars: int = MAX_ROW_CHARS) -> SourceRows | None:
    for suffix in (".jsonl", ".parquet"):
        candidate = folder / f"{split}{suffix}"
        if candidate.exists():
            if suffix == ".jsonl":
                return _read_jsonl(candidate, max_chars)
            return _numbered(str(candidate), read_parquet_table(candidate, "task data file").to_pylist())
    return None


def source_splits(spec: TaskSpec) -> dict[str, str]:
    """Our split -> the source split it is read from."""
    if spec.split_protocol == "paper":
        return {"train": spec.split_names.get("train", "train"), "test": spec.split_names.get("test", "validation")}
    if spec.split_protocol == "seeded_halves":
        return {"test": spec.split_names.get("test", "test")}
    return {split: spec.split_names.get(split, split) for split in SPLITS}


def read_hf_splits(spec: TaskSpec) -> dict[str, SourceRows]:
    import datasets  # network access; never exercised in tests

    loaded = datasets.load_dataset(spec.hf_name, spec.hf_config, trust_remote_code=False)
    out = {}
    for split, source in source_splits(spec).items():
        if source not in loaded:
            continue
        dataset = loaded[source]
        rows = dataset.to_list()
        # ClassLabel tag sequences (e.g. conll2003 ner_tags) become their string names
        tag_column = spec.columns.get("tags", "tags")
        feature = dataset.features.get(tag_column)
        names = getattr(getattr(feature, "feature", None), "names", None)
        numbered = _numbered(f"hf:{spec.hf_name} [{source}]", rows)
        if names:
            for row, where in zip(rows, numbered.locations):
                row[tag_column] = tag_names(row[tag_column], names, where)
        out[split] = numbered
    return out


def _rename(rows: list[dict[str, Any]], columns: dict[str, str]) -> list[dict[str, Any]]:
    if not columns:
        return rows
    return [{**row, **{target: row[source] for target, source in columns.items() if source in row}} for row in rows]


def _require(row: dict, key: str, kind: type | tuple, where: str, optional: bool = False) -> Any:
    if key not in row or row[key] is None:
        if optional:
            return None
        raise TaskDataError(f"{where}: missing field {key!r} (have {sorted(row)})")
    if not isinstance(row[key], kind):
        raise TaskDataError(f"{where}: field {key!r} must be {kind}, got {type(row[key]).__name__}")
    return row[key]


def _normalise_row(family: str, row: dict[str, Any], where: str, index: int) -> dict[str, Any] | None:
    if family == "classification":
        label = _require(row, "label", (int, str), where)
        if isinstance(label, int) and label < 0:  # GLUE-style unlabeled test rows
            return None
        out = {"text": _require(row, "text", str, where), "label": label}
        pair = _require(row, "text_pair", str, where, optional=True)
        if pair is not None:
            out["text_pair"] = pair
        return out
    if family == "token_classification":
        tokens = _require(row, "tokens", list, where)
        tags = _require(row, "tags", list, where)
        if len(tokens) != len(tags):
            raise TaskDataError(f"{where}: {len(tokens)} tokens but {len(tags)} tags")
        try:
            check_tags(tags, where)
        except TagError as err:
            raise TaskDataError(str(err)) from err
        return {"tokens": [str(t) for t in tokens], "tags": tags}
    if family == "qa":
        context = _require(row, "context", str, where)
        answers = _require(row, "answers", (dict, list), where)
        if isinstance(answers, dict):
            texts, starts = list(answers.get("text", [])), list(answers.get("answer_start", []))
            if len(starts) != len(texts):
                raise TaskDataError(f"{where}: answers.text and answers.answer_start differ in length")
        else:  # plain answer strings: locate each in the context (e.g. ReCoRD)
            texts, starts = list(answers), [context.find(t) for t in answers]
        for text, start in zip(texts, starts):
            if start < 0 or context[start:start + len(text)] != text:
                raise TaskDataError(f"{where}: answer {text!r} is not found at {start} in the context")
        return {"id": str(row.get("id", index)), "question": _require(row, "question", str, where),
                "context": context, "answers": {"text": texts, "answer_start": starts}}
    positives = _require(row, "positives", (list, str), where)
    positives = [positives] if isinstance(positives, str) else positives
    if not positives:
        raise TaskDataError(f"{where}: 'positives' is empty")
    negatives = _require(row, "negatives", list, where, optional=True) or []
    out = {"query": _require(row, "query", str, where), "positives": positives, "negatives": negatives}
    if row.get("id") is not None:
        out["id"] = str(row["id"])  # BEIR query id (what NQ's halves are drawn over, splits.py)
    if row.get("positive_ids") is not None:  # id-keyed sets: relevance by document id, not by text
        out["positive_ids"] = [str(doc) for doc in row["positive_ids"]]
    return out


def normalise_rows(spec: TaskSpec, raw: SourceRows, locations: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """Validated rows in our schema; `locations`, when given, receives id(row) -> where the row came from."""
    normalised = []
    for index, (row, where) in enumerate(zip(_rename(raw.rows, spec.columns), raw.locations)):
        chars = text_chars(row)
        if chars > spec.max_row_chars:  # before any tokenizer sees it (prepare_data's bound, for evaluation data)
            raise too_long(where, chars, spec.max_row_chars)
        out = _normalise_row(spec.family, row, where, index)
        if out is not None:
            normalised.append(out)
            if locations is not None:
                locations[id(out)] = where
    return normalised



def _read_source_splits(spec: TaskSpec) -> dict[str, SourceRows]:
    from mlmclm.eval.data.data_root import fetched_root, hub_root
    from mlmclm.eval.data.sources import TASK_SOURCES, read_task_source

    wanted = {split: source for split, source in source_splits(spec).items()
              if source in TASK_SOURCES[spec.source].splits}
    root_of = hub_root if spec.path is None else fetched_root(Path(spec.path), spec.allow_other_revisions)
    parts = read_task_source(spec.source, list(dict.fromkeys(wanted.values())), root_of)
    out = {}
    for split, source in wanted.items():
        part = parts[source]
        locations = part.locations or _numbered(part.origin, part.rows).locations
        out[split] = SourceRows(part.origin, part.rows, locations, part.label_names, part.corpus)
    return out


def rows_digest(rows) -> str:
    """A digest of rows as read (each as sorted-key JSON, in order): any change of their content changes it."""
    digest = hashlib.sha256()
    for row in rows:
        digest.update(json.dumps(row, sort_keys=True, ensure_ascii=False, default=repr).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()[:16]


def provenance_of(raw: dict[str, SourceRows], spec: TaskSpec) -> dict[str, Any]:
    """Per source split, where its rows came from, how many it held and their digest (what every run record carries,
    and what its fingerprint covers: the same path or revision with other rows is other data)."""
    names = source_splits(spec)
    out = {names[split]: {"origin": rows.source, "rows": len(rows.rows), "sha256": rows_digest(rows.rows)}
           for split, rows in raw.items()}
    corpus = next((rows.corpus for rows in raw.values() if rows.corpus is not None), None)
    if corpus is not None:
        out["corpus"] = {"documents": len(corpus), "sha256": rows_digest(sorted(corpus.items()))}
    return out


def read_splits(spec: TaskSpec) -> dict[str, SourceRows]:
    if spec.source is not None:
        return _read_source_splits(spec)
    if spec.path is None:
        return read_hf_splits(spec)
    folder = Path(spec.path)
    if not folder.is_dir():
        raise TaskDataError(f"task {spec.name!r}: data folder {folder} does not exist")
    return {split: rows for split, source in source_splits(spec).items()
            if (rows := read_local_split(folder, source, spec.max_row_chars)) is not None}

