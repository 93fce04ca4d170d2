"""Task specifications: what a downstream task is (family, where its data lives, split protocol, rules, metric),
checked when built, and the containers its loaded rows come in (TaskData, EvalSet). Loading: task_loading.py.

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

from mlmclm.bounded_read import read_regular_json
from mlmclm.eval.data.data_files import MAX_ROW_CHARS
from mlmclm.eval.data.splits import seeded_query_halves
from mlmclm.eval.finetune.tags import TAG_SCHEMES
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
    max_row_chars: int = MAX_ROW_CHARS  # the text one row may hold (data_files.py); a longer row is refused

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
        if isinstance(self.max_row_chars, bool) or not isinstance(self.max_row_chars, int) or self.max_row_chars < 1:
            raise ValueError(f"task {self.name!r}: max_row_chars must be an integer >= 1, got {self.max_row_chars!r}")
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
        raw = read_regular_json(path, what="task list")  # bounded: a FIFO must not block the run
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read task list {path}: {err}") from err
    if not isinstance(raw, list):
        raise ValueError(f"{path}: expected a JSON list of task objects")
    specs = [TaskSpec.from_dict(entry) for entry in raw]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: task names must be unique, got {names}")
    return specs
