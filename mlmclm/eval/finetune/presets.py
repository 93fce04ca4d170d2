"""Paper tasks by name, and the paper's suite (EncodEval's MLM_vs_CLM configuration: hgissbkh/EncodEval, branch
MLM_vs_CLM, encodeval/datasets.py and configs/).

The suite: SC = SST-2, MNLI, QQP; TC = CoNLL-2003, OntoNotes 5, UNER-en; QA = SQuAD, SQuAD-v2, QED, ReCoRD;
IR = MS MARCO, NQ, MLDR-en (trained once on MS MARCO, tested on all three). Splits follow EncodEval: SC and QA
validate on 5 % of train (seed 42) and test on the official validation split (MNLI: validation_matched); TC uses
each dataset's own train / validation / test; inputs are cut at 99 % of the model's max_position_embeddings
(rounded); MNLI and QQP pairs are one text ("Premise: …\nHypothesis: …", "Question 1: …\nQuestion 2: …");
retrieval uses "Query: " / "Document: " prefixes. Every paper task reads EncodEval's own repository
(sources.py), from the hub or from a folder written by `tools/evaluate.py fetch`.
"""
from __future__ import annotations

from pathlib import Path

from mlmclm.eval.finetune.task_spec import ENCODEVAL_METRIC, TaskSpec

PRESETS: dict[str, dict] = {
    "sst2": dict(family="classification", hf_name="nyu-mll/glue", hf_config="sst2", columns={"text": "sentence"}),
    "mnli": dict(family="classification", hf_name="nyu-mll/glue", hf_config="mnli",
                 split_names={"validation": "validation_matched", "test": "validation_mismatched"},
                 columns={"text": "premise", "text_pair": "hypothesis"}),
    "qqp": dict(family="classification", hf_name="nyu-mll/glue", hf_config="qqp",
                columns={"text": "question1", "text_pair": "question2"}),
    "conll2003": dict(family="token_classification", hf_name="eriktks/conll2003", columns={"tags": "ner_tags"}),
    "squad": dict(family="qa", hf_name="rajpurkar/squad", max_length=384),
    "squad_v2": dict(family="qa", hf_name="rajpurkar/squad_v2", max_length=384),
    "record": dict(family="qa", hf_name="aps/super_glue", hf_config="record", max_length=384,
                   columns={"context": "passage", "question": "query"}),
}

# EncodEval's token classification (rimads/avey-b EncodEval/encodeval/eval_tasks/TC.py): every sub-token labelled
# with its word's tag, words predicted by majority vote, scored by the mean per-sentence macro F1 (seqeval's entity
# F1 is reported beside it in every run).
_ENCODEVAL_TC = dict(token_labels="every")

# The paper suite: per task, its family and what differs from the defaults (the paper protocol's splits, no length
# cap). Sources: sources.TASK_SOURCES.
_OWN_SPLITS = dict(split_protocol="official")  # EncodEval's TC: the dataset's own train / validation / test
PAPER_TASKS: dict[str, dict] = {
    "sst2": dict(family="classification"),
    "mnli": dict(family="classification", split_names={"test": "validation_matched"},
                 pair_template="Premise: {text}\nHypothesis: {text_pair}"),
    "qqp": dict(family="classification", pair_template="Question 1: {text}\nQuestion 2: {text_pair}"),
    # hgissbkh/conll2003-en carries the original IOB1 tags (tags.py)
    "conll2003": dict(family="token_classification", tag_scheme="IOB1", **_ENCODEVAL_TC, **_OWN_SPLITS),
    "ontonotes5": dict(family="token_classification", **_ENCODEVAL_TC, **_OWN_SPLITS),
    "uner_en": dict(family="token_classification", **_ENCODEVAL_TC, **_OWN_SPLITS),
    "squad": dict(family="qa"),
    "squad_v2": dict(family="qa"),
    "qed": dict(family="qa"),
    "record": dict(family="qa"),
    # EncodEval (encodeval/datasets.py): trained on MS MARCO pairs; MS MARCO validated on BEIR's dev qrels and
    # tested on BEIR's "test" qrels (TREC-DL 2019); MLDR-en on its dev and test; NQ's BEIR test queries halved per
    # seed (our seeded draw: EncodEval's is unseeded, splits.py); each set ranks its own id-keyed corpus
    # (retrieval_sets.py)
    "msmarco": dict(family="retrieval", query_prefix="Query: ", document_prefix="Document: ",
                    split_protocol="official", extra_tests={"nq": "seeded_halves", "mldr_en": "official"}),
}
PAPER_TEST_ONLY = ("nq", "mldr_en")  # scored with the model fine-tuned on msmarco


def preset_task(name: str, **overrides) -> TaskSpec:
    if name not in PRESETS:
        raise ValueError(f"unknown preset task {name!r}; known: {sorted(PRESETS)}")
    return TaskSpec(name=name, **{**PRESETS[name], **overrides})


def paper_task(name: str, data_root: Path | None = None, allow_other_revisions: bool = False) -> TaskSpec:
    """One task of the paper suite, read from EncodEval's repositories: from `data_root` (a folder written by
    `tools/evaluate.py fetch`) or, when None, the hub; run under EncodEval's rules (inputs, heads, scores), its
    score the main metric and the family's standard metric reported beside it."""
    if name not in PAPER_TASKS:
        hint = " (it is scored with the msmarco model: select msmarco)" if name in PAPER_TEST_ONLY else ""
        raise ValueError(f"unknown paper task {name!r}{hint}; known: {sorted(PAPER_TASKS)}")
    entry = PAPER_TASKS[name]
    path = None if data_root is None else str(data_root)
    common = dict(name=name, family=entry["family"], split_protocol=entry.get("split_protocol", "paper"),
                  max_length=None, split_names=entry.get("split_names", {}),
                  query_prefix=entry.get("query_prefix", ""), document_prefix=entry.get("document_prefix", ""),
                  pair_template=entry.get("pair_template"), token_labels=entry.get("token_labels", "first"),
                  tag_scheme=entry.get("tag_scheme", "IOB2"), source=name, path=path,
                  allow_other_revisions=allow_other_revisions,
                  rules="encodeval", metric=ENCODEVAL_METRIC[entry["family"]])
    extra = {t: {"source": t, "path": path, "split_protocol": protocol,
                 "allow_other_revisions": allow_other_revisions}
             for t, protocol in entry.get("extra_tests", {}).items()}
    return TaskSpec(**common, extra_tests=extra)


def paper_suite(data_root: Path | None = None, names: list[str] | None = None,
                allow_other_revisions: bool = False) -> list[TaskSpec]:
    """The paper's tasks (all, or `names`), each with EncodEval's sources, splits, length and retrieval settings."""
    return [paper_task(name, data_root, allow_other_revisions) for name in (names or list(PAPER_TASKS))]
