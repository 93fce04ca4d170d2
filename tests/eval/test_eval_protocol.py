import json
import math

import pytest
from eval_fixtures import make_task_folder

from mlmclm.eval.finetune.protocol import ProtocolConfig, RunRecord, load_records, run_path, select_learning_rate
from mlmclm.eval.finetune.task_spec import TaskSpec
from mlmclm.eval.grid.run import run_grid
from mlmclm.eval.reports.summary import family_results, stability_results, summary_markdown, task_results, write_summary


def record(lr, seed, val, test, task="t", family="classification", model="m", diverged=False):
    return RunRecord(model=model, task=task, family=family, main_metric="accuracy", learning_rate=lr, seed=seed,
                     validation={"accuracy": val}, test={"accuracy": test}, diverged=diverged, steps=1,
                     train_loss_first=1.0, train_loss_last=0.5, fingerprint="x")


def test_lr_selection_uses_validation_not_test():
    # lr 1e-4 is best on validation, 5e-4 best on test: selection must pick 1e-4 and report its test scores
    records = [record(1e-4, 0, 0.9, 0.2), record(1e-4, 1, 0.8, 0.3),
               record(5e-4, 0, 0.5, 0.99), record(5e-4, 1, 0.6, 0.97)]
    assert select_learning_rate(records) == 1e-4
    (result,) = task_results(records)
    assert result.best_lr == 1e-4
    assert result.test_mean == pytest.approx(0.25)
    assert result.validation_mean == pytest.approx(0.85)


def test_family_ci_over_seeds_of_task_means():
    records = [record(1e-4, s, 0.5, v, task="a") for s, v in enumerate([0.1, 0.2, 0.3])]
    records += [record(1e-4, s, 0.5, v, task="b") for s, v in enumerate([0.3, 0.4, 0.5])]
    (family,) = family_results(records)
    # per-seed family means 0.2, 0.3, 0.4: mean 0.3, sd 0.1, t(0.975, 2) = 4.302653
    assert family.test_mean == pytest.approx(0.3)
    assert family.test_ci95 == pytest.approx(4.302653 * 0.1 / math.sqrt(3), rel=1e-5)
    assert family.tasks == ("a", "b") and family.seeds == 3


def test_stability_spread_and_diverged_fraction():
    records = [record(1e-4, 0, 0.9, 0.6), record(1e-4, 1, 0.9, 0.8),
               record(5e-4, 0, 0.1, 0.1, diverged=True), record(5e-4, 1, 0.2, float("nan"))]
    task_row, model_row = stability_results(records)
    assert task_row.std_over_seeds == pytest.approx(math.sqrt(0.02))  # 0.6, 0.8
    assert task_row.worst_to_best_gap == pytest.approx(0.7)  # 0.8 - 0.1, NaN ignored
    assert task_row.diverged_fraction == pytest.approx(0.5)  # flagged run + non-finite score
    assert model_row.task == "(all)" and model_row.runs == 4
    text = summary_markdown(records)
    assert "| m | t | 4 | 14.1 |" in text and "50 %" in text


def test_grid_writes_runs_resumes_and_summarises(tmp_path, tiny_model_dir):
    spec = TaskSpec(name="cls", family="classification", path=str(make_task_folder(tmp_path / "data", "classification",
                                                                                    sizes=(24, 8, 8))), max_length=32)
    protocol = ProtocolConfig(learning_rates=(1e-4, 1e-3), seeds=(0, 1), max_steps=3, batch_size=8)
    out = tmp_path / "out"
    first = run_grid({"tiny": tiny_model_dir}, [spec], out, protocol, progress=False)
    paths = sorted((out / "runs").glob("tiny/cls/*.json"))
    assert len(first) == 4 and len(paths) == 4
    assert not list(out.rglob("*.tmp"))
    stamps = {p: p.stat().st_mtime_ns for p in paths}

    # re-run: nothing is re-trained (files untouched), the same records come back
    second = run_grid({"tiny": tiny_model_dir}, [spec], out, protocol, progress=False)
    assert {p: p.stat().st_mtime_ns for p in paths} == stamps
    assert [r.test for r in second] == [r.test for r in first]

    # a missing run is redone, and redone identically (deterministic)
    missing = run_path(out, "tiny", "cls", 1e-3, 1)
    saved = json.loads(missing.read_text())
    missing.unlink()
    run_grid({"tiny": tiny_model_dir}, [spec], out, protocol, progress=False)
    redone = json.loads(missing.read_text())
    assert redone["test"] == saved["test"] and redone["train_loss_last"] == saved["train_loss_last"]
    assert all(p.stat().st_mtime_ns == stamps[p] for p in paths if p != missing)

    # a changed budget changes the fingerprint, so the stale result is not reused
    changed = ProtocolConfig(learning_rates=(1e-4,), seeds=(0,), max_steps=2, batch_size=8)
    run_grid({"tiny": tiny_model_dir}, [spec], out, changed, progress=False)
    assert run_path(out, "tiny", "cls", 1e-4, 0).stat().st_mtime_ns != stamps[run_path(out, "tiny", "cls", 1e-4, 0)]

    summary = write_summary(load_records(out), out)
    text = summary.read_text()
    assert "| tiny | classification | cls | accuracy |" in text
    assert json.loads((out / "summary.json").read_text())["tasks"][0]["task"] == "cls"


def test_grid_rejects_non_model_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        run_grid({"x": tmp_path}, [], tmp_path / "out", ProtocolConfig(seeds=(0,)), progress=False)
