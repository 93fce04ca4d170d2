"""The paper's evaluation protocol (EncodEval): splits, optimiser, budgets, length, retrieval trained once and
tested on three sets (the whole suite from its sources: test_paper_sources.py)."""
import random

import pytest
import torch
from eval_fixtures import make_task_folder, write_jsonl

from mlmclm.eval.data.splits import paper_validation_split
from mlmclm.eval.finetune.presets import PAPER_TASKS, paper_suite
from mlmclm.eval.finetune.protocol import ProtocolConfig
from mlmclm.eval.finetune.task_loading import load_task
from mlmclm.eval.finetune.task_spec import TaskDataError, TaskSpec
from mlmclm.eval.finetune.training import FinetuneConfig, budget_steps, default_max_length, make_optimizer


def test_validation_is_five_percent_of_train_as_datasets_splits_it():
    datasets = pytest.importorskip("datasets")
    rows = [{"i": i} for i in range(101)]
    train, validation = paper_validation_split(rows)
    reference = datasets.Dataset.from_list(rows).train_test_split(test_size=0.05, seed=42)
    assert [r["i"] for r in validation] == reference["test"]["i"]  # ceil(5.05) = 6 rows, same order
    assert [r["i"] for r in train] == reference["train"]["i"]


def test_paper_splits_test_on_the_official_validation(tmp_path):
    rng = random.Random(0)
    train = [{"text": f"t{i}", "label": rng.choice(["a", "b"])} for i in range(40)]
    official = [{"text": f"v{i}", "label": "a"} for i in range(7)]
    write_jsonl(tmp_path / "train.jsonl", train)
    write_jsonl(tmp_path / "validation_matched.jsonl", official)
    write_jsonl(tmp_path / "validation_mismatched.jsonl", [{"text": "x", "label": "b"}])
    data = load_task(TaskSpec(name="mnli", family="classification", path=str(tmp_path), split_protocol="paper",
                              split_names={"test": "validation_matched"}))
    assert [r["text"] for r in data["test"]] == [r["text"] for r in official]
    assert len(data["validation"]) == 2 and len(data["train"]) == 38  # ceil(5 % of 40)
    assert {r["text"] for r in data["validation"]} | {r["text"] for r in data["train"]} == {r["text"] for r in train}
    with pytest.raises(TaskDataError, match="no 'validation' split"):
        load_task(TaskSpec(name="x", family="classification", path=str(tmp_path), split_protocol="paper"))


def test_an_empty_split_file_is_refused_not_replaced(tmp_path):
    make_task_folder(tmp_path, "classification")
    (tmp_path / "test.jsonl").write_text("")
    with pytest.raises(TaskDataError, match=r"test\.jsonl is empty"):
        load_task(TaskSpec(name="cls", family="classification", path=str(tmp_path)))


def test_encodeval_optimiser_budgets_and_length(tiny_model_dir):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    groups = make_optimizer(model, FinetuneConfig(learning_rate=1e-4)).param_groups
    assert [(g["betas"], g["eps"], g["weight_decay"]) for g in groups] == [((0.9, 0.95), 1e-5, 0.1),
                                                                             ((0.9, 0.95), 1e-5, 0.0)]
    paper = ProtocolConfig.paper()
    sc, tc = paper.finetune_config(1e-4, 0, "classification"), paper.finetune_config(1e-4, 0, "token_classification")
    assert budget_steps(320, sc) == 1000  # 10 epochs of 320 examples at batch 32: goes past one epoch
    assert budget_steps(100_000, tc) == 3125  # one full epoch, no step cap
    assert budget_steps(320, ProtocolConfig().finetune_config(1e-4, 0, "classification")) == 10  # ours: min
    assert default_max_length(tiny_model_dir) == 507  # round(0.99 × 512 = 506.88)
    with pytest.raises(ValueError, match="cannot both be None"):
        FinetuneConfig(learning_rate=1e-4, max_steps=None, max_epochs=None)


def test_suite_has_the_papers_13_tasks():
    specs = paper_suite()  # the hub path: specs need no network, only loading does
    names = [s.name for s in specs] + [t for s in specs for t in s.extra_tests]
    assert sorted(names) == sorted(["sst2", "mnli", "qqp", "conll2003", "ontonotes5", "uner_en", "squad",
                                    "squad_v2", "qed", "record", "msmarco", "nq", "mldr_en"])
    msmarco = next(s for s in specs if s.name == "msmarco")
    assert (msmarco.query_prefix, msmarco.document_prefix) == ("Query: ", "Document: ")
    assert all(s.max_length is None for s in specs)
    assert {s.name: s.split_protocol for s in specs if s.split_protocol != "paper"} == {
        "msmarco": "official", "conll2003": "official", "ontonotes5": "official", "uner_en": "official"}
    assert all(s.source == s.name and s.path is None for s in specs)
    assert {t: f["split_protocol"] for t, f in msmarco.extra_tests.items()} == {"nq": "seeded_halves",
                                                                                 "mldr_en": "official"}
    assert len(PAPER_TASKS) == 11
