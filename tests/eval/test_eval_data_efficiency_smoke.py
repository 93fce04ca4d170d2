import json
import re

import pytest
from eval_fixtures import make_task_folder, save_tiny_model

from mlmclm.eval.checks.smoke import run_smoke_evaluation
from mlmclm.eval.checks.smoke_tasks import SmokeSizes, write_smoke_tasks
from mlmclm.eval.finetune.protocol import ProtocolConfig
from mlmclm.eval.finetune.task_loading import load_task
from mlmclm.eval.finetune.task_spec import TaskSpec
from mlmclm.eval.reports.data_efficiency import evaluate_checkpoints, list_checkpoints, read_curve


def fake_run(run_dir, states):
    for iteration, state in states.items():
        folder = run_dir / "checkpoints" / f"iter_{iteration:07d}"
        folder.mkdir(parents=True)
        if state is not None:
            (folder / "train_state.json").write_text(json.dumps(state))
    (run_dir / "checkpoints" / "latest").write_text(str(max(states)))
    return run_dir


def test_list_checkpoints_reads_train_state_defensively(tmp_path):
    run = fake_run(tmp_path / "run", {
        20: {"iteration": 20, "consumed_tokens": 2048, "phase_index": 1, "phase_name": "mlm"},
        10: {"iteration": 10, "consumed_tokens": "lots", "phase_name": 3},  # wrong types -> None
        30: None,  # no run_config.json
    })
    (run / "checkpoints" / "iter_bad").mkdir()
    found = list_checkpoints(run)
    assert [c.iteration for c in found] == [10, 20, 30]
    assert found[1].consumed_tokens == 2048 and found[1].phase_name == "mlm" and found[1].phase_index == 1
    assert found[0].consumed_tokens is None and found[0].phase_name is None
    assert found[2].consumed_tokens is None
    with pytest.raises(FileNotFoundError, match="no checkpoints/ folder"):
        list_checkpoints(tmp_path / "elsewhere")


def test_curve_over_checkpoints_with_injected_exporter(tmp_path):
    run = fake_run(tmp_path / "run", {
        100: {"iteration": 100, "consumed_tokens": 1000, "phase_index": 0, "phase_name": "clm"},
        200: {"iteration": 200, "consumed_tokens": 2000, "phase_index": 1, "phase_name": "mlm"},
    })
    calls = []

    def exporter(checkpoint_dir, output_dir):
        calls.append(checkpoint_dir.name)
        iteration = int(re.search(r"\d+", checkpoint_dir.name).group())
        return save_tiny_model(output_dir, seed=iteration)

    task = TaskSpec(name="cls", family="classification",
                    path=str(make_task_folder(tmp_path / "data", "classification", sizes=(16, 8, 8))), max_length=32)
    protocol = ProtocolConfig(learning_rates=(1e-3,), seeds=(0,), max_steps=2, batch_size=8)
    curve = evaluate_checkpoints(run, [task], tmp_path / "out", protocol, exporter=exporter, progress=False)
    points = read_curve(curve)
    assert calls == ["iter_0000100", "iter_0000200"]
    assert [(p["iteration"], p["consumed_tokens"], p["phase_name"]) for p in points] == [
        (100, 1000, "clm"), (200, 2000, "mlm")]
    for point in points:
        assert 0.0 <= point["task_scores"]["cls"] <= 1.0
        assert point["family_scores"]["classification"] == pytest.approx(point["task_scores"]["cls"])
    # a second pass reuses the exports and the finished runs
    evaluate_checkpoints(run, [task], tmp_path / "out", protocol, exporter=exporter, progress=False)
    assert calls == ["iter_0000100", "iter_0000200"]
    assert read_curve(curve) == points


def test_smoke_tasks_are_deterministic_and_valid(tmp_path):
    sizes = SmokeSizes(train=16, validation=8, test=8)
    first = write_smoke_tasks(tmp_path / "a", sizes=sizes)
    second = write_smoke_tasks(tmp_path / "b", sizes=sizes)
    assert {s.family for s in first} == {"classification", "token_classification", "qa", "retrieval"}
    for a, b in zip(first, second):
        for split in ("train", "validation", "test"):
            assert (tmp_path / "a" / a.name / f"{split}.jsonl").read_text() == \
                   (tmp_path / "b" / b.name / f"{split}.jsonl").read_text()
        data = load_task(a)  # schema-valid
        assert len(data["train"]) == 16
    qa = load_task(next(s for s in first if s.family == "qa"))
    for row in qa["train"]:
        for text, start in zip(row["answers"]["text"], row["answers"]["answer_start"]):
            assert row["context"][start:start + len(text)] == text and text[0].isupper()
    assert any(not row["answers"]["text"] for row in qa["train"] + qa["validation"] + qa["test"])  # SQuAD-v2 style


def test_run_smoke_evaluation_end_to_end(tmp_path):
    specs = write_smoke_tasks(tmp_path / "words", sizes=SmokeSizes(train=16, validation=8, test=8))
    words = set()
    for spec in specs:
        for split in ("train", "validation", "test"):
            words.update(re.findall(r"\w+|[^\w\s]", (tmp_path / "words" / spec.name / f"{split}.jsonl").read_text()))
    model = save_tiny_model(tmp_path / "model", words=sorted(words))
    summary = run_smoke_evaluation({"tiny": model}, tmp_path / "out", lrs=(1e-3,), seeds=(0,), max_steps=2,
                                   batch_size=8, sizes=SmokeSizes(train=16, validation=8, test=8), progress=False)
    text = summary.read_text()
    for task in ("smoke_which_play", "smoke_speaker_names", "smoke_named_character", "smoke_speech_halves"):
        assert f"| {task} |" in text
    assert len(list((tmp_path / "out" / "runs" / "tiny").glob("*/*.json"))) == 4
