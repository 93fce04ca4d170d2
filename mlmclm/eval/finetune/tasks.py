"""Task specifications and loading: local JSONL/parquet files or HF `datasets` names, normalised per family.

Schemas (one JSON object per row; see docs/evaluation.md):
- classification:        {"text": str, "text_pair": str (optional), "label": int | str}
- token_classification:  {"tokens": [str], "tags": [str]}          (BIO/IOB2 tags, one per token)
- qa:                    {"id": str (optional), "question": str, "context": str,
                          "answers": {"text": [str], "answer_start": [int]} | [str]}  (empty = unanswerable)
- retrieval:             {"query": str, "positives": [str] | str, "negatives": [str] (optional)}
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlmclm.eval.data.splits import paper_validation_split, seeded_query_halves, shuffled
from mlmclm.eval.finetune.tags import TAG_SCHEMES, TagError, check_tags, tag_inventory
from mlmclm.path_names import check_path_component

FAMILIES = ("classification", "token_classification", "qa", "retrieval")
FAMILY_SHORT = {"classification": "SC", "token_classification": "TC", "qa": "QA", "retrieval": "IR"}  # the paper's
SPLITS = ("train", "validation", "test")
MAIN_METRIC = {"classification": "accuracy", "token_classification": "entity_f1", "qa": "f1",
               "retrieval": "ndcg@10"}
# Other main metrics a task may choose (TaskSpec.metric); every run reports all of its family's metrics.
OTHER_METRICS = {"token_classification": ("sentence_macro_f1",), "qa": ("encodeval_f1",),
                 "retrieval": ("encodeval_ndcg@10",)}
# "standard": the inputs, heads and scores above (MAIN_METRIC: what everyone else reports); "encodeval": EncodEval's
# (encodeval_inputs.py, encodeval_heads.py, encodeval_scores.py), scored by ENCODEVAL_METRIC — the paper suite's,
# whose runs also report the family's standard metric beside it.
RULES = ("standard", "encodeval")
ENCODEVAL_METRIC = {"classification": "accuracy", "token_classification": "sentence_macro_f1", "qa": "encodeval_f1",
                    "retrieval": "encodeval_ndcg@10"}
TOKEN_LABELS = ("first", "every")  # label each word's first sub-token, or all of them (EncodEval)
# "given": the source's splits, missing ones derived; "paper": validation = 5 % of train, test = the official
# validation; "official": every split from its own file, none derived (BEIR-style retrieval sets: validation = dev
# qrels, test = test qrels); "seeded_halves": an eval-only set given as one test split whose queries are halved
# into validation and test per fine-tuning seed (NQ; seeded, unlike EncodEval's draw). Rules: splits.py.
SPLIT_PROTOCOLS = ("given", "paper", "official", "seeded_halves")


class TaskDataError(ValueError):
    """A task's data is missing or does not follow its family's schema."""


@dataclass(frozen=True)
class TaskSpec:
    """One downstream task. Exactly one of `path` (folder with train/validation/test .jsonl or .parquet)
    and `hf_name` (a `datasets` name, needs network) is set — unless `source` names a paper source
    (sources.TASK_SOURCES), read from `path` (a folder written by `fetch`) or, when None, the hub at its pinned
    revision. `columns` maps schema fields to source columns."""

    name: str
    family: str
    path: str | None = None
    hf_name: str | None = None
    source: str | None = None  # a key of sources.TASK_SOURCES: EncodEval's own repositories
    allow_other_revisions: bool = False  # source read from a fetched folder whose revisions differ from the pins
    hf_config: str | None = None
    split_names: dict[str, str] = field(default_factory=dict)
    columns: dict[str, str] = field(default_factory=dict)
    max_length: int | None = 256  # None: 99 % of the model's max_position_embeddings (EncodEval)
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    # "given": the source's train/validation/test (missing ones derived, see load_task); "paper" (EncodEval):
    # validation = 5 % of train (seed 42), test = the official validation split (split_names["test"] names it).
    split_protocol: str = "given"
    query_prefix: str = ""  # retrieval: prepended to queries ("Query: " in the paper)
    document_prefix: str = ""  # retrieval: prepended to passages ("Document: ")
    # retrieval: more test sets scored with the model fine-tuned on this task (name -> TaskSpec fields with
    # `path` or `hf_name`); each becomes its own task in the results (MS MARCO -> NQ, MLDR-en in the paper)
    extra_tests: dict[str, dict] = field(default_factory=dict)
    # classification pairs: one text made from the pair, e.g. "Premise: {text}\nHypothesis: {text_pair}" (EncodEval
    # feeds MNLI and QQP so); None: the tokenizer's text-pair encoding
    pair_template: str | None = None
    # token classification: "first" labels a word's first sub-token (and predicts from it); "every" labels all its
    # sub-tokens and predicts the majority over them (EncodEval)
    token_labels: str = "first"
    metric: str | None = None  # the main metric when not the family's (MAIN_METRIC), e.g. "sentence_macro_f1"
    rules: str = "standard"  # a value of RULES: whose inputs, heads and scores the task is run with
    tag_scheme: str = "IOB2"  # token classification: "IOB2" or "IOB1" (tags.py; the paper's CoNLL is IOB1)

    def __post_init__(self) -> None:
        check_path_component(self.name, "task name")
        if self.family not in FAMILIES:
            raise ValueError(f"task {self.name!r}: family must be one of {FAMILIES}, got {self.family!r}")
        if self.source is not None:
            from mlmclm.eval.data.sources import TASK_SOURCES

            if self.source not in TASK_SOURCES or self.hf_name is not None:
                raise ValueError(f"task {self.name!r}: source must be one of {sorted(TASK_SOURCES)} (without "
                                 f"hf_name), got {self.source!r}")
        elif (self.path is None) == (self.hf_name is None):
            raise ValueError(f"task {self.name!r}: set exactly one of `path` and `hf_name`")
        if self.max_length is not None and self.max_length < 8:
            raise ValueError(f"task {self.name!r}: max_length must be >= 8, got {self.max_length}")
        if self.split_protocol not in SPLIT_PROTOCOLS:
            raise ValueError(f"task {self.name!r}: split_protocol must be one of {SPLIT_PROTOCOLS}, "
                             f"got {self.split_protocol!r}")
        if self.pair_template is not None and (self.family != "classification" or any(
                f"{{{name}}}" not in self.pair_template for name in ("text", "text_pair"))):
            raise ValueError(f"task {self.name!r}: pair_template is for classification pairs and must contain "
                             f"{{text}} and {{text_pair}}, got {self.pair_template!r}")
        if self.token_labels not in TOKEN_LABELS:
            raise ValueError(f"task {self.name!r}: token_labels must be one of {TOKEN_LABELS}, "
                             f"got {self.token_labels!r}")
        allowed = (MAIN_METRIC[self.family], *OTHER_METRICS.get(self.family, ()))
        if self.metric is not None and self.metric not in allowed:
            raise ValueError(f"task {self.name!r}: metric must be one of {allowed} for {self.family}, "
                             f"got {self.metric!r}")
        if self.tag_scheme not in TAG_SCHEMES:
            raise ValueError(f"task {self.name!r}: tag_scheme must be one of {TAG_SCHEMES}, got {self.tag_scheme!r}")
        if self.rules not in RULES:
            raise ValueError(f"task {self.name!r}: rules must be one of {RULES}, got {self.rules!r}")
        if self.metric is not None and self.metric.startswith("encodeval_") and self.rules != "encodeval":
            raise ValueError(f"task {self.name!r}: metric {self.metric!r} is computed under rules 'encodeval' only")
        if self.rules == "encodeval" and self.family == "token_classification" and self.token_labels != "every":
            raise ValueError(f"task {self.name!r}: EncodEval labels every sub-token: rules 'encodeval' needs "
                             f"token_labels 'every'")
        if self.extra_tests and self.family != "retrieval":
            raise ValueError(f"task {self.name!r}: extra_tests is for retrieval tasks only")
        unknown = set(self.split_names) - set(SPLITS)
        if unknown:
            raise ValueError(f"task {self.name!r}: split_names keys must be among {SPLITS}, got {sorted(unknown)}")
        for limit in ("max_train_examples", "max_eval_examples"):
            value = getattr(self, limit)
            if value is not None and value < 1:
                raise ValueError(f"task {self.name!r}: {limit} must be >= 1, got {value}")

    @property
    def main_metric(self) -> str:
        return self.metric or MAIN_METRIC[self.family]

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TaskSpec:
        try:
            return cls(**raw)
        except TypeError as err:
            raise ValueError(f"bad task entry {raw!r}: {err}") from err


@dataclass
class TaskData:
    """Normalised rows per split; `labels` is the label inventory (classification / tag set), `notes` says
    how missing splits were derived."""

    spec: TaskSpec
    splits: dict[str, list[dict[str, Any]]]
    labels: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra_tests: dict[str, EvalSet] = field(default_factory=dict)  # retrieval: name -> its evaluation splits
    # retrieval sets keyed by id (EncodEval's BEIR/MLDR sets): id -> text, the one corpus validation and test rank
    corpus: dict[str, str] | None = None
    provenance: dict[str, Any] = field(default_factory=dict)  # source split -> {"origin", "rows"} (run records)

    def __getitem__(self, split: str) -> list[dict[str, Any]]:
        return self.splits[split]


@dataclass
class EvalSet:
    """An eval-only retrieval set (a task's `extra_tests` entry): "test" rows and, when the set has its own,
    "validation" rows; with `seeded_halves` its one test split is halved per fine-tuning seed (a seeded draw:
    EncodEval halves NQ unseeded, splits.py)."""

    splits: dict[str, list[dict[str, Any]]]
    seeded_halves: bool = False
    corpus: dict[str, str] | None = None  # id -> text when the set is keyed by id (TaskData.corpus)
    provenance: dict[str, Any] = field(default_factory=dict)

    def for_seed(self, seed: int) -> dict[str, list[dict[str, Any]]]:
        if not self.seeded_halves:
            return self.splits
        validation, test = seeded_query_halves(self.splits["test"], seed)
        return {"validation": validation, "test": test}


def load_task_specs(path: Path) -> list[TaskSpec]:
    """Read a JSON list of task entries (the fields of `TaskSpec`)."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read task list {path}: {err}") from err
    if not isinstance(raw, list):
        raise ValueError(f"{path}: expected a JSON list of task objects")
    specs = [TaskSpec.from_dict(entry) for entry in raw]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: task names must be unique, got {names}")
    return specs


@dataclass
class SourceRows:
    """The rows of one source split, each with where it came from (1-based: `file:line`, `file row n`), so every
    error about a row points at the line to fix."""

    source: str  # the file, or `hf:name [split]`, or `repo@revision [glob]`
    rows: list[dict[str, Any]]
    locations: list[str]
    label_names: list[str] | None = None  # the dataset's own tag names, in its id order (ClassLabel)
    corpus: dict[str, str] | None = None  # id-keyed retrieval corpus shared by the set's splits


def _read_jsonl(path: Path) -> SourceRows:
    rows, locations = [], []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
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


def _read_local_split(folder: Path, split: str) -> SourceRows | None:
    for suffix in (".jsonl", ".parquet"):
        candidate = folder / f"{split}{suffix}"
        if candidate.exists():
            if suffix == ".jsonl":
                return _read_jsonl(candidate)
            import pyarrow.parquet as pq

            return _numbered(str(candidate), pq.read_table(candidate).to_pylist())
    return None


def _source_splits(spec: TaskSpec) -> dict[str, str]:
    """Our split -> the source split it is read from."""
    if spec.split_protocol == "paper":
        return {"train": spec.split_names.get("train", "train"), "test": spec.split_names.get("test", "validation")}
    if spec.split_protocol == "seeded_halves":
        return {"test": spec.split_names.get("test", "test")}
    return {split: spec.split_names.get(split, split) for split in SPLITS}


def _read_hf_splits(spec: TaskSpec) -> dict[str, SourceRows]:
    import datasets  # network access; never exercised in tests

    loaded = datasets.load_dataset(spec.hf_name, spec.hf_config, trust_remote_code=False)
    out = {}
    for split, source in _source_splits(spec).items():
        if source not in loaded:
            continue
        dataset = loaded[source]
        rows = dataset.to_list()
        # ClassLabel tag sequences (e.g. conll2003 ner_tags) become their string names
        tag_column = spec.columns.get("tags", "tags")
        feature = dataset.features.get(tag_column)
        names = getattr(getattr(feature, "feature", None), "names", None)
        if names:
            for row in rows:
                row[tag_column] = [names[i] for i in row[tag_column]]
        out[split] = _numbered(f"hf:{spec.hf_name} [{source}]", rows)
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


def _normalise_rows(spec: TaskSpec, raw: SourceRows, locations: dict[int, str] | None = None) -> list[dict[str, Any]]:
    """Validated rows in our schema; `locations`, when given, receives id(row) -> where the row came from."""
    normalised = []
    for index, (row, where) in enumerate(zip(_rename(raw.rows, spec.columns), raw.locations)):
        out = _normalise_row(spec.family, row, where, index)
        if out is not None:
            normalised.append(out)
            if locations is not None:
                locations[id(out)] = where
    return normalised


def load_extra_tests(spec: TaskSpec) -> dict[str, EvalSet]:
    """The eval-only sets of a retrieval task. Split protocol "official": its validation and test files (both
    needed); "seeded_halves": its test file, halved per seed at run time; otherwise its test (else validation) file
    alone, or the HF split — then the LR is chosen on the training task's validation."""
    out = {}
    for name, fields in spec.extra_tests.items():
        sub = TaskSpec.from_dict({"name": name, "family": "retrieval", **fields})
        if sub.split_protocol in ("official", "seeded_halves"):
            wanted = ("validation", "test") if sub.split_protocol == "official" else ("test",)
            raw = _read_splits(sub)
            missing = [split for split in wanted if split not in raw]
            if missing:
                raise TaskDataError(f"task {spec.name!r}: extra set {name!r} has no {' / '.join(missing)} split in "
                                    f"{sub.path or 'hf:' + str(sub.hf_name)} (split protocol {sub.split_protocol!r})")
            sources = {split: raw[split] for split in wanted}
        elif sub.path is not None:
            folder = Path(sub.path)
            source = sub.split_names.get("test")
            rows = None
            for candidate in ([source] if source else ["test", "validation"]):
                rows = _read_local_split(folder, candidate)
                if rows is not None:
                    break
            if rows is None:
                raise TaskDataError(f"task {spec.name!r}: extra test {name!r} has no test/validation file in {folder}")
            sources = {"test": rows}
        else:
            raw = _read_hf_splits(TaskSpec(**{**sub.__dict__, "split_protocol": "paper"}))
            if "test" not in raw:
                raise TaskDataError(f"task {spec.name!r}: extra test {name!r} has no such split in hf:{sub.hf_name}")
            sources = {"test": raw["test"]}
        splits = {}
        for split, rows in sources.items():
            splits[split] = _normalise_rows(sub, rows)
            if not splits[split]:
                raise TaskDataError(f"task {spec.name!r}: extra test {name!r} in {rows.source} has no rows")
        corpus = next((rows.corpus for rows in sources.values() if rows.corpus is not None), None)
        out[name] = EvalSet(splits, seeded_halves=sub.split_protocol == "seeded_halves", corpus=corpus,
                            provenance=provenance_of(sources, sub))
        if out[name].seeded_halves:
            try:
                out[name].for_seed(0)  # refuse a set that cannot be halved now, not at the first run
            except ValueError as err:
                raise TaskDataError(f"task {spec.name!r}: extra set {name!r}: {err}") from err
    return out


def _read_source_splits(spec: TaskSpec) -> dict[str, SourceRows]:
    from mlmclm.eval.data.data_root import fetched_root, hub_root
    from mlmclm.eval.data.sources import TASK_SOURCES, read_task_source

    wanted = {split: source for split, source in _source_splits(spec).items()
              if source in TASK_SOURCES[spec.source].splits}
    root_of = hub_root if spec.path is None else fetched_root(Path(spec.path), spec.allow_other_revisions)
    parts = read_task_source(spec.source, list(dict.fromkeys(wanted.values())), root_of)
    out = {}
    for split, source in wanted.items():
        part = parts[source]
        numbered = _numbered(part.origin, part.rows)
        out[split] = SourceRows(part.origin, part.rows, numbered.locations, part.label_names, part.corpus)
    return out


def provenance_of(raw: dict[str, SourceRows], spec: TaskSpec) -> dict[str, Any]:
    """Per source split, where its rows came from and how many it held (what every run record carries)."""
    names = _source_splits(spec)
    out = {names[split]: {"origin": rows.source, "rows": len(rows.rows)} for split, rows in raw.items()}
    corpus = next((rows.corpus for rows in raw.values() if rows.corpus is not None), None)
    if corpus is not None:
        out["corpus"] = {"documents": len(corpus)}
    return out


def _read_splits(spec: TaskSpec) -> dict[str, SourceRows]:
    if spec.source is not None:
        return _read_source_splits(spec)
    if spec.path is None:
        return _read_hf_splits(spec)
    folder = Path(spec.path)
    if not folder.is_dir():
        raise TaskDataError(f"task {spec.name!r}: data folder {folder} does not exist")
    return {split: rows for split, source in _source_splits(spec).items()
            if (rows := _read_local_split(folder, source)) is not None}


def load_task(spec: TaskSpec) -> TaskData:
    """Load, validate and normalise a task; derive missing validation/test splits deterministically."""
    if spec.split_protocol == "seeded_halves":
        raise TaskDataError(f"task {spec.name!r}: split protocol 'seeded_halves' is for eval-only sets (extra_tests)")
    raw = _read_splits(spec)
    origin = spec.path if spec.path is not None else f"hf:{spec.hf_name}"
    if "train" not in raw:
        raise TaskDataError(f"task {spec.name!r}: no train split in {origin} (expected train.jsonl or train.parquet)")

    splits: dict[str, list[dict[str, Any]]] = {}
    notes = []
    locations: dict[int, str] = {}  # id(row) -> file:line, for errors found after the splits are rearranged
    for split, rows in raw.items():
        if not rows.rows:  # an empty file is a mistake to report; only a missing one is derived (below)
            derivable = split != "train" and spec.split_protocol == "given"
            raise TaskDataError(f"task {spec.name!r}: {rows.source} is empty (no rows)"
                                + ("; fill it, or remove it to have the split derived" if derivable else ""))
        normalised = _normalise_rows(spec, rows, locations)
        if normalised:
            splits[split] = normalised
        else:  # e.g. GLUE's test splits, whose labels are all -1
            notes.append(f"{rows.source} has no labeled rows; ignored")
    if "train" not in splits:
        raise TaskDataError(f"task {spec.name!r}: the train split in {origin} has no labeled rows")

    if spec.split_protocol == "paper":
        if "test" not in splits:
            raise TaskDataError(f"task {spec.name!r}: no '{_source_splits(spec)['test']}' split in {origin} "
                                f"(the paper protocol tests on the official validation split)")
        try:
            splits["train"], splits["validation"] = paper_validation_split(splits["train"])
        except ValueError as err:
            raise TaskDataError(f"task {spec.name!r}: {err}") from err
        notes.append(f"validation = 5 % of train (seed 42); test = the official "
                     f"'{_source_splits(spec)['test']}' split")
    elif spec.split_protocol == "official":
        missing = [split for split in ("validation", "test") if split not in splits]
        if missing:
            raise TaskDataError(f"task {spec.name!r}: no {' / '.join(_source_splits(spec)[m] for m in missing)} split "
                                f"in {origin} (the 'official' protocol reads every split from its own file)")
        notes.append("validation and test are the source's own splits (none derived)")
    elif "validation" not in splits and "test" not in splits:
        rows = shuffled(splits["train"])
        tenth = max(1, len(rows) // 10)
        splits["validation"], splits["test"], splits["train"] = rows[:tenth], rows[tenth:2 * tenth], rows[2 * tenth:]
        notes.append("validation and test are each 10 % of train (shuffled with seed 0)")
    elif "test" not in splits or "validation" not in splits:
        present = "validation" if "validation" in splits else "test"
        rows = shuffled(splits[present])
        half = len(rows) // 2
        if half == 0:
            raise TaskDataError(f"task {spec.name!r}: {present} has one row, too few to derive the missing split")
        splits["validation"], splits["test"] = rows[:half], rows[half:]
        notes.append(f"validation and test are the two halves of the labeled {present} split (seed 0)")

    if spec.max_train_examples is not None and len(splits["train"]) > spec.max_train_examples:
        splits["train"] = shuffled(splits["train"])[: spec.max_train_examples]
    if spec.max_eval_examples is not None:
        for split in ("validation", "test"):
            if len(splits[split]) > spec.max_eval_examples:
                splits[split] = shuffled(splits[split])[: spec.max_eval_examples]

    labels: list[Any] = []
    if spec.family == "classification":
        labels = sorted({row["label"] for row in splits["train"]}, key=lambda v: (str(type(v)), v))
        if len(labels) < 2:
            raise TaskDataError(f"task {spec.name!r}: train has fewer than two distinct labels ({labels})")
        for split in ("validation", "test"):
            unseen = {row["label"] for row in splits[split]} - set(labels)
            if unseen:
                raise TaskDataError(f"task {spec.name!r}: {split} has labels never seen in train: {sorted(unseen)}")
    elif spec.family == "token_classification":
        try:
            labels = tag_inventory(spec.name, splits, locations, raw["train"].label_names, spec.tag_scheme)
        except TagError as err:
            raise TaskDataError(str(err)) from err
    extra = load_extra_tests(spec) if spec.extra_tests else {}
    corpus = next((rows.corpus for rows in raw.values() if rows.corpus is not None), None)
    return TaskData(spec=spec, splits=splits, labels=labels, notes=notes, extra_tests=extra, corpus=corpus,
                    provenance=provenance_of(raw, spec))

