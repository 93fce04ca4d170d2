import random

import pytest
from eval_fixtures import classification_rows, make_task_folder, write_jsonl

from mlmclm.eval.finetune.runner import finetune_and_score
from mlmclm.eval.finetune.task_loading import load_task
from mlmclm.eval.finetune.task_spec import TaskDataError, TaskSpec
from mlmclm.eval.finetune.training import FinetuneConfig

CONFIG = FinetuneConfig(learning_rate=1e-3, seed=0, max_steps=12, batch_size=8)


@pytest.mark.parametrize("family,metrics", [
    ("classification", ["accuracy"]),
    ("token_classification", ["entity_f1", "sentence_macro_f1"]),
    ("qa", ["exact_match", "f1"]),
    ("retrieval", ["ndcg@10", "queries", "corpus"]),  # the counts say what the score was taken over
])
def test_family_runs_end_to_end(tmp_path, tiny_model_dir, family, metrics):
    data = load_task(TaskSpec(name=family, family=family, path=str(make_task_folder(tmp_path, family)), max_length=48))
    outcome = finetune_and_score(tiny_model_dir, data, CONFIG)
    assert set(outcome.metrics) == {"validation", "test"}
    for split in ("validation", "test"):
        assert set(outcome.metrics[split]) == set(metrics)
        for name, value in outcome.metrics[split].items():
            assert 0.0 <= value <= 1.0 or name in ("queries", "corpus")
    assert outcome.log.steps == 6  # one epoch of 48 examples at batch 8 is below max_steps=12
    assert len(outcome.log.losses) == 6


def test_sentence_pairs_and_same_seed_same_result(tmp_path, tiny_model_dir):
    rng = random.Random(1)
    for split, n in (("train", 32), ("validation", 8)):
        write_jsonl(tmp_path / f"{split}.jsonl", classification_rows(n, rng, pairs=True))
    data = load_task(TaskSpec(name="pairs", family="classification", path=str(tmp_path), max_length=32))
    assert "two halves" in data.notes[0]  # test split derived from validation
    first = finetune_and_score(tiny_model_dir, data, CONFIG)
    second = finetune_and_score(tiny_model_dir, data, CONFIG)
    assert first.metrics == second.metrics and first.log.losses == second.log.losses


def test_qa_unanswerable_questions_enable_empty_predictions(tmp_path, tiny_model_dir):
    folder = make_task_folder(tmp_path, "qa")
    data = load_task(TaskSpec(name="qa", family="qa", path=str(folder), max_length=48))
    assert any(not r["answers"]["text"] for r in data["test"])  # the fixture contains unanswerable questions


def test_schema_errors_name_the_file_row_and_field(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"text": "a", "label": "x"}, {"txt": "b", "label": "y"}])
    with pytest.raises(TaskDataError, match=r"train\.jsonl:2: missing field 'text'"):
        load_task(TaskSpec(name="bad", family="classification", path=str(tmp_path)))
    (tmp_path / "train.jsonl").write_text('{"text": "a", "label": 1}\nnot json\n')
    with pytest.raises(TaskDataError, match=r"train.jsonl:2: invalid JSON"):
        load_task(TaskSpec(name="bad", family="classification", path=str(tmp_path)))
    with pytest.raises(TaskDataError, match="does not exist"):
        load_task(TaskSpec(name="gone", family="qa", path=str(tmp_path / "nowhere")))
    with pytest.raises(ValueError, match="family must be one of"):
        TaskSpec(name="x", family="regression", path=".")


def test_qa_answer_must_match_context(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"question": "q", "context": "alice lives in rome",
                                            "answers": {"text": ["paris"], "answer_start": [15]}}])
    with pytest.raises(TaskDataError, match="'paris' is not found at 15"):
        load_task(TaskSpec(name="qa", family="qa", path=str(tmp_path)))
