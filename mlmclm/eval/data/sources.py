"""Where each task of the paper suite comes from, as EncodEval loads it (hgissbkh/EncodEval, branch MLM_vs_CLM,
encodeval/datasets.py): the same hub repositories, read as plain parquet / TSV files in their hub layout, never
through a dataset script (`datasets` >= 4 refuses those; their parquet export, `refs/convert/parquet`, is read
instead). Every reader takes the repository's folder — a hub snapshot or the copy `tools/evaluate.py fetch`
wrote — so the hub path and the offline path are the same code.

Revision pins: `Repo.revision` is the commit a source is read at. None means no commit SHA of that repository was
found in any material this project could read (the hub is not reachable from where this was written): such a
source is *unpinned*; `fetch` resolves and records the commit it downloaded, and every report says "unpinned".
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mlmclm.eval.data.hub_files import HubLayoutError, read_parquet, read_parquet_located, read_qrels, tag_names
from mlmclm.eval.data.retrieval_sets import beir_sets, mldr_sets, read_documents

MAIN, PARQUET_EXPORT = "main", "refs/convert/parquet"


@dataclass(frozen=True)
class Repo:
    """A hub dataset repository: the commit it is pinned to (None: unknown), the branch its files are on when
    unpinned, and the globs of the files the suite reads (what `fetch` downloads)."""

    name: str
    revision: str | None
    ref: str
    files: tuple[str, ...]
    script_based: bool = False  # read through its parquet export (ref PARQUET_EXPORT)

    @property
    def pin_text(self) -> str:
        return f"{self.name}@{self.revision}" if self.revision else f"{self.name}@unpinned"


# Layouts: GLUE / SQuAD: `<config>/<split>-NNNNN-of-NNNNN.parquet` (the repos' own parquet); hgissbkh copies that
# EncodEval loads without trust_remote_code: `data/<split>-*.parquet` (what `push_to_hub` writes); script-based
# repos (EncodEval passes trust_remote_code): their parquet export `<config>/<split>/NNNN.parquet`; BEIR: the
# `corpus/` and `queries/` parquet of the corpus repos and `<split>.tsv` qrels (dev.tsv is the "validation" split).
REPOS: dict[str, Repo] = {repo.name: repo for repo in (
    Repo("nyu-mll/glue", None, MAIN, ("sst2/*.parquet", "mnli/train-*.parquet", "mnli/validation_matched-*.parquet",
                                      "qqp/train-*.parquet", "qqp/validation-*.parquet")),
    Repo("hgissbkh/conll2003-en", None, MAIN, ("data/*.parquet",)),
    Repo("hgissbkh/ontonotes5", None, PARQUET_EXPORT, ("default/*/*.parquet",), script_based=True),
    Repo("hgissbkh/uner_en", None, MAIN, ("data/*.parquet",)),
    Repo("rajpurkar/squad", None, MAIN, ("plain_text/*.parquet",)),
    Repo("rajpurkar/squad_v2", None, MAIN, ("squad_v2/*.parquet",)),
    Repo("hgissbkh/qed", None, MAIN, ("data/*.parquet",)),
    Repo("hgissbkh/record", None, MAIN, ("data/*.parquet",)),
    Repo("hgissbkh/msmarco-pairs", None, MAIN, ("data/train-*.parquet",)),
    Repo("BeIR/msmarco", None, MAIN, ("corpus/*.parquet", "queries/*.parquet")),
    Repo("BeIR/msmarco-qrels", None, MAIN, ("dev.tsv", "test.tsv")),
    Repo("BeIR/nq", None, MAIN, ("corpus/*.parquet", "queries/*.parquet")),
    Repo("BeIR/nq-qrels", None, MAIN, ("test.tsv",)),
    Repo("hgissbkh/mldr-en", None, PARQUET_EXPORT, ("default/dev/*.parquet", "default/test/*.parquet",
                                                    "corpus/corpus/*.parquet"), script_based=True),
)}


@dataclass(frozen=True)
class TaskSource:
    """One paper task's files: per source split, (repo, glob); `columns` renames source columns to our schema
    (EncodEval's renames); `kind` picks the reader."""

    splits: dict[str, tuple[str, str]]
    columns: dict[str, str] = field(default_factory=dict)
    kind: str = "rows"  # "rows", "msmarco", "nq", "mldr"


def _glue(config: str, splits: tuple[str, ...], **columns: str) -> TaskSource:
    return TaskSource({s: ("nyu-mll/glue", f"{config}/{s}-*.parquet") for s in splits}, columns)


def _own(repo: str, splits: tuple[str, ...], pattern: str = "data/{split}-*.parquet", **columns: str) -> TaskSource:
    return TaskSource({s: (repo, pattern.format(split=s)) for s in splits}, columns)


TC_SPLITS = ("train", "validation", "test")
TASK_SOURCES: dict[str, TaskSource] = {
    "sst2": _glue("sst2", ("train", "validation"), text="sentence"),
    "mnli": _glue("mnli", ("train", "validation_matched"), text="premise", text_pair="hypothesis"),
    "qqp": _glue("qqp", ("train", "validation"), text="question1", text_pair="question2"),
    "conll2003": _own("hgissbkh/conll2003-en", TC_SPLITS, tokens="words", tags="ner"),
    "ontonotes5": _own("hgissbkh/ontonotes5", TC_SPLITS, "default/{split}/*.parquet"),
    "uner_en": _own("hgissbkh/uner_en", TC_SPLITS, tags="ner_tags"),
    "squad": _own("rajpurkar/squad", ("train", "validation"), "plain_text/{split}-*.parquet"),
    "squad_v2": _own("rajpurkar/squad_v2", ("train", "validation"), "squad_v2/{split}-*.parquet"),
    "qed": _own("hgissbkh/qed", ("train", "validation")),
    "record": _own("hgissbkh/record", ("train", "validation")),
    "msmarco": TaskSource({"train": ("hgissbkh/msmarco-pairs", "data/train-*.parquet"),
                           "validation": ("BeIR/msmarco-qrels", "dev.tsv"), "test": ("BeIR/msmarco-qrels", "test.tsv"),
                           "corpus": ("BeIR/msmarco", "corpus/*.parquet"),
                           "queries": ("BeIR/msmarco", "queries/*.parquet")}, kind="msmarco"),
    "nq": TaskSource({"test": ("BeIR/nq-qrels", "test.tsv"), "corpus": ("BeIR/nq", "corpus/*.parquet"),
                      "queries": ("BeIR/nq", "queries/*.parquet")}, kind="nq"),
    "mldr_en": TaskSource({"validation": ("hgissbkh/mldr-en", "default/dev/*.parquet"),
                           "test": ("hgissbkh/mldr-en", "default/test/*.parquet"),
                           "corpus": ("hgissbkh/mldr-en", "corpus/corpus/*.parquet")}, kind="mldr"),
}
EVAL_ONLY_PARTS = ("corpus", "queries")  # parts of a retrieval source that are no split of their own


@dataclass
class SourceSplit:
    """The rows of one source split with where they came from: `origin` (repo@revision and file glob), the
    ClassLabel names of its label column (token tags: the dataset's own ids), and for retrieval sets the corpus the
    split ranks against (id -> text, shared by the set's splits)."""

    origin: str
    rows: list[dict[str, Any]]
    label_names: list[str] | None = None
    corpus: dict[str, str] | None = None
    files: list[Path] = field(default_factory=list)
    locations: list[str] | None = None  # per row, `file row n` (None: numbered within `origin`)


RootOf = Callable[[str], tuple[Path, str]]  # repo name -> (its folder, the revision that folder holds)


def task_repos(task: str) -> list[str]:
    return sorted({repo for repo, _ in TASK_SOURCES[task].splits.values()})


def read_task_source(task: str, wanted: list[str], root_of: RootOf) -> dict[str, SourceSplit]:
    """Source split -> its rows, for the wanted source splits of `task` that exist in its source."""
    source = TASK_SOURCES[task]
    unknown = [split for split in wanted if split not in source.splits]
    if unknown:
        raise HubLayoutError(f"task {task!r}: its source has no split {unknown} (has "
                             f"{[s for s in source.splits if s not in EVAL_ONLY_PARTS]})")

    def where(part: str) -> tuple[Path, str]:
        repo, pattern = source.splits[part]
        folder, revision = root_of(repo)
        pinned = REPOS[repo].revision is not None
        return folder, pattern, f"{repo}@{revision if pinned else f'unpinned (read {revision})'} [{pattern}]"

    if source.kind == "rows":
        out = {}
        for split in wanted:
            folder, pattern, origin = where(split)
            rows, names, files, locations = read_parquet_located(folder, pattern)
            renamed = [{**row, **{ours: row[theirs] for ours, theirs in source.columns.items() if theirs in row}}
                       for row in rows]
            tags = names.get(source.columns.get("tags", "tags"))
            if tags:  # integer tags -> their names (the dataset's ClassLabel), kept in the dataset's id order
                for row, location in zip(renamed, locations):
                    if isinstance(row.get("tags"), list):
                        row["tags"] = tag_names(row["tags"], tags, location)
            out[split] = SourceSplit(origin, renamed, label_names=tags, files=files, locations=locations)
        return out
    return _read_retrieval(task, source, wanted, where)


def _read_retrieval(task, source, wanted, where) -> dict[str, SourceSplit]:
    out = {}
    if "train" in wanted:  # MS MARCO training pairs: (query, positive) -> one positive per row
        folder, pattern, origin = where("train")
        rows, _, files = read_parquet(folder, pattern)
        out["train"] = SourceSplit(origin, [{"query": r["query"], "positives": [r["positive"]]} for r in rows],
                                   files=files)
    evaluated = [split for split in ("validation", "test") if split in source.splits]
    if not any(split in wanted for split in evaluated):
        return out
    if source.kind == "mldr":
        judged = {split: read_parquet(*where(split)[:2])[0] for split in evaluated}
        folder, pattern, _ = where("corpus")
        rows, corpus = mldr_sets(judged, lambda ids: read_documents(folder, pattern, "docid", ids, ("text",)))
    else:
        qrels = {split: read_qrels(*where(split)[:2]) for split in evaluated}
        corpus_folder, corpus_pattern, _ = where("corpus")
        queries_folder, queries_pattern, _ = where("queries")
        titled = source.kind == "nq"  # EncodEval's NQ documents are "{title}. {text}"; MS MARCO's the text alone
        rows, corpus = beir_sets(
            qrels, lambda ids: read_documents(queries_folder, queries_pattern, "_id", ids, ("text",)),
            lambda ids: read_documents(corpus_folder, corpus_pattern, "_id", ids,
                                       ("title", "text") if titled else ("text",)))
    for split in evaluated:
        if split in wanted:
            out[split] = SourceSplit(where(split)[2], rows[split], corpus=corpus)
    return out
