"""Paper tasks by name, and the paper's suite (EncodEval's MLM_vs_CLM configuration as issue 13 records it).

The suite: SC = SST-2, MNLI, QQP; TC = CoNLL-2003, OntoNotes 5, UNER-en; QA = SQuAD, SQuAD-v2, QED, ReCoRD;
IR = MS MARCO, NQ, MLDR-en (trained once on MS MARCO, tested on all three). Splits follow EncodEval: validation =
5 % of train (seed 42), test = the official validation split (MNLI: validation_matched); inputs are cut at 99 % of
the model's max_position_embeddings (rounded); MNLI and QQP pairs are one text ("Premise: …\nHypothesis: …",
"Question 1: …\nQuestion 2: …", EncodEval's encodeval/datasets.py); retrieval uses "Query: " / "Document: " prefixes.

Retrieval (EncodEval's BEIR-based sets, local folders only): msmarco/ holds train (the training pairs), validation
(BEIR dev qrels) and test (BEIR test qrels = TREC-DL 2019); nq/ its BEIR test qrels as test (halved per seed, rows
with the BEIR query `id`); mldr_en/ its dev as validation and its test.

Hugging Face names need the network and are not exercised in tests; the hub schemas of OntoNotes, UNER, QED and
the BEIR-style retrieval sets differ from ours, so those tasks read local folders in our schemas (docs/evaluation.md)
— `paper_suite(data_root=...)` reads every task from `data_root/<task>/`.
"""
from __future__ import annotations

from pathlib import Path

from mlmclm.eval.tasks import TaskSpec

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

# EncodEval's token classification (eval_tasks/token_classification.py): every sub-token labelled with its word's
# tag, words predicted by majority vote, scored by the mean per-sentence macro F1 (seqeval's entity F1 is reported
# beside it in every run).
_ENCODEVAL_TC = dict(token_labels="every", metric="sentence_macro_f1")

# The paper suite: per task, its family and what differs from our schema on the hub (None: local folder only).
PAPER_TASKS: dict[str, dict] = {
    "sst2": dict(family="classification", hub=dict(hf_name="nyu-mll/glue", hf_config="sst2",
                                                   columns={"text": "sentence"})),
    "mnli": dict(family="classification", split_names={"test": "validation_matched"},
                 pair_template="Premise: {text}\nHypothesis: {text_pair}",
                 hub=dict(hf_name="nyu-mll/glue", hf_config="mnli",
                          columns={"text": "premise", "text_pair": "hypothesis"})),
    "qqp": dict(family="classification", pair_template="Question 1: {text}\nQuestion 2: {text_pair}",
                hub=dict(hf_name="nyu-mll/glue", hf_config="qqp",
                         columns={"text": "question1", "text_pair": "question2"})),
    "conll2003": dict(family="token_classification", **_ENCODEVAL_TC, hub=dict(hf_name="eriktks/conll2003",
                                                                                columns={"tags": "ner_tags"})),
    "ontonotes5": dict(family="token_classification", **_ENCODEVAL_TC, hub=None),
    "uner_en": dict(family="token_classification", **_ENCODEVAL_TC, hub=None),
    "squad": dict(family="qa", hub=dict(hf_name="rajpurkar/squad")),
    "squad_v2": dict(family="qa", hub=dict(hf_name="rajpurkar/squad_v2")),
    "qed": dict(family="qa", hub=None),
    "record": dict(family="qa", hub=dict(hf_name="aps/super_glue", hf_config="record",
                                         columns={"context": "passage", "question": "query"})),
    # EncodEval (encodeval/datasets.py): trained on MS MARCO pairs; MS MARCO validated on BEIR's dev qrels and
    # tested on BEIR's "test" qrels (TREC-DL 2019); MLDR-en on its dev and test; NQ's BEIR test queries halved per
    # seed; each set ranks against the documents of both its splits' qrels (retrieval.py)
    "msmarco": dict(family="retrieval", hub=None, query_prefix="Query: ", document_prefix="Document: ",
                    split_protocol="official", extra_tests={"nq": "seeded_halves", "mldr_en": "official"}),
}
PAPER_TEST_ONLY = ("nq", "mldr_en")  # scored with the model fine-tuned on msmarco


def preset_task(name: str, **overrides) -> TaskSpec:
    if name not in PRESETS:
        raise ValueError(f"unknown preset task {name!r}; known: {sorted(PRESETS)}")
    return TaskSpec(name=name, **{**PRESETS[name], **overrides})


def paper_task(name: str, data_root: Path | None = None) -> TaskSpec:
    """One task of the paper suite: from `data_root/<name>/` (our schema) or, when None, from the hub."""
    if name not in PAPER_TASKS:
        hint = " (it is scored with the msmarco model: select msmarco)" if name in PAPER_TEST_ONLY else ""
        raise ValueError(f"unknown paper task {name!r}{hint}; known: {sorted(PAPER_TASKS)}")
    entry = PAPER_TASKS[name]
    common = dict(name=name, family=entry["family"], split_protocol=entry.get("split_protocol", "paper"),
                  max_length=None,
                  split_names=entry.get("split_names", {}), query_prefix=entry.get("query_prefix", ""),
                  document_prefix=entry.get("document_prefix", ""), pair_template=entry.get("pair_template"),
                  token_labels=entry.get("token_labels", "first"), metric=entry.get("metric"))
    extra = entry.get("extra_tests", {})
    if data_root is not None:
        return TaskSpec(path=str(Path(data_root) / name), **common,
                        extra_tests={t: {"path": str(Path(data_root) / t), "split_protocol": protocol}
                                     for t, protocol in extra.items()})
    if entry["hub"] is None:
        raise ValueError(f"paper task {name!r} has no hub loader here (its hub schema differs from ours): convert "
                         f"it to the {entry['family']} schema of docs/evaluation.md and pass --data-root")
    return TaskSpec(**entry["hub"], **common)


def paper_suite(data_root: Path | None = None, names: list[str] | None = None) -> list[TaskSpec]:
    """The paper's tasks (all, or `names`), each with EncodEval's splits, length and retrieval settings."""
    return [paper_task(name, data_root) for name in (names or list(PAPER_TASKS))]
