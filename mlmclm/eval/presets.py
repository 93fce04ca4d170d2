"""Paper tasks available by HF `datasets` name (network needed; not exercised in tests). Retrieval sets
(MS MARCO, NQ, MLDR) ship as BEIR-style corpus/queries/qrels tables: convert them to the local retrieval schema
(docs/evaluation.md) and pass the folder instead."""
from __future__ import annotations

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


def preset_task(name: str, **overrides) -> TaskSpec:
    if name not in PRESETS:
        raise ValueError(f"unknown preset task {name!r}; known: {sorted(PRESETS)}")
    return TaskSpec(name=name, **{**PRESETS[name], **overrides})
