import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
from torch.utils.tensorboard import SummaryWriter

from mlmclm.eval.finetune.protocol import RunRecord, run_path, write_json_atomic
from mlmclm.eval.reports.compare import RunInputs, compare_runs
from mlmclm.eval.reports.tensorboard_logs import TAG_TOKENS, loss_tag, read_scalars

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_log(folder: Path, objectives, final_loss):
    writer = SummaryWriter(log_dir=str(folder))
    for step in range(1, 11):
        for objective in objectives:
            writer.add_scalar(loss_tag(objective), final_loss + (10 - step) * 0.1, step)
        writer.add_scalar(TAG_TOKENS, step * 512, step)
    writer.close()


def write_eval(folder: Path, label, scores):
    for seed, score in enumerate(scores):
        record = RunRecord(model=label, task="sst", family="classification", main_metric="accuracy",
                           learning_rate=1e-4, seed=seed, validation={"accuracy": score}, test={"accuracy": score},
                           diverged=False, steps=5, train_loss_first=1.0, train_loss_last=0.5, fingerprint="f")
        write_json_atomic(run_path(folder, label, "sst", 1e-4, seed), asdict(record))
    write_json_atomic(folder / "curve.json", {"points": [
        {"iteration": 100, "mean_score": scores[0] - 0.1}, {"iteration": 200, "mean_score": scores[0]}]})


@pytest.fixture
def two_runs(tmp_path):
    write_log(tmp_path / "clm" / "tb", ["clm"], final_loss=2.5)
    write_log(tmp_path / "mix" / "tb", ["clm", "mlm"], final_loss=3.0)
    write_eval(tmp_path / "clm" / "eval", "CLM", [0.6, 0.7])
    write_eval(tmp_path / "mix" / "eval", "CLM25-MLM75", [0.8, 0.9])
    return tmp_path


def test_read_scalars_round_trip(two_runs):
    scalars = read_scalars(two_runs / "mix" / "tb")
    assert list(scalars[TAG_TOKENS].steps) == list(range(1, 11))
    assert scalars[loss_tag("mlm")].values[-1] == pytest.approx(3.0)


def test_runs_logged_under_the_older_tag_names_are_read_under_todays(tmp_path):
    """Runs written before mlmclm/tensorboard_tags.py named `train/clm/loss` what is now `clm/loss`."""
    writer = SummaryWriter(log_dir=str(tmp_path))
    for step in (1, 2):
        writer.add_scalar("train/clm/loss", 4.0 - step, step)
        writer.add_scalar("train/tokens", step * 256, step)
    writer.close()
    scalars = read_scalars(tmp_path)
    assert loss_tag("clm") == "clm/loss" and list(scalars[loss_tag("clm")].values) == [3.0, 2.0]
    assert list(scalars[TAG_TOKENS].values) == [256.0, 512.0] and "train/clm/loss" not in scalars


def test_runs_logged_in_the_one_folder_layout_are_read_under_todays_tags(tmp_path):
    """Runs logged before the phase folders (one folder; `clm/accuracy`, `clm/held_out_loss`)."""
    writer = SummaryWriter(log_dir=str(tmp_path))
    for step in (1, 2):
        writer.add_scalar("clm/loss", 4.0 - step, step)
        writer.add_scalar("clm/accuracy", 0.1 * step, step)
        writer.add_scalar("mlm/held_out_loss", 5.0 - step, step)
    writer.close()
    scalars = read_scalars(tmp_path)
    assert set(scalars) == {"clm/loss", "clm/token_accuracy", "mlm/loss_held_out"}
    assert list(scalars["mlm/loss_held_out"].values) == [4.0, 3.0]


def test_the_trainers_phase_folders_are_read_as_one_flat_set_of_tags(tmp_path):
    """What the training loop's logger writes (the run's folder, a folder per phase below it), read back under the
    canonical tags; a resumed run's second writer re-logs a step, and the later value wins."""
    from types import SimpleNamespace

    from mlmclm.train.logger import MetricsLogger

    def log(steps, offset):
        logger = MetricsLogger(tmp_path, 10, True, {}, ["clm", "mlm"], mfu=False, run_name="mine")
        for step in steps:
            phase = "clm" if step <= 2 else "mlm"
            result = SimpleNamespace(loss=10.0 - step + offset, accuracy=0.1, lr=1e-3, grad_norm=1.0, skipped=False)
            extra = {"val/clm/loss": 7.0, "val/mlm/loss": 8.0 + offset} if step == 2 else None
            logger.step(step, phase, int(phase == "mlm"), result, step * 64, 64, 2, 1e6, 1, None, extra)
        logger.close()

    log([1, 2, 3], 0.0)
    log([3, 4], 0.5)
    assert {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_dir()} == \
        {"mine", "mine/clm", "mine/mlm"}
    scalars = read_scalars(tmp_path)
    assert list(scalars["clm/loss"].steps) == [1, 2] and list(scalars["mlm/loss"].values) == [7.5, 6.5]
    assert scalars["mlm/loss_held_out"].values.tolist() == [8.0] and "clm/token_accuracy" in scalars
    assert list(scalars[TAG_TOKENS].steps) == [1, 2, 3, 4] and "loss" not in scalars


def test_compare_runs_writes_pngs_and_table(two_runs):
    out = two_runs / "cmp"
    table = compare_runs([RunInputs("CLM", two_runs / "clm" / "tb", two_runs / "clm" / "eval"),
                          RunInputs("CLM25-MLM75", two_runs / "mix" / "tb", two_runs / "mix" / "eval")], out)
    for name in ("loss_vs_tokens.png", "downstream_vs_steps.png", "stability.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    text = table.read_text()
    # final losses, tokens at the last step, and family test mean (percent) per run
    assert "| CLM | 2.5 | n/a | 5.12e+03 | 65 |" in text
    assert "| CLM25-MLM75 | 3 | 3 | 5.12e+03 | 85 |" in text


def test_compare_runs_cli_errors_on_missing_folder(tmp_path):
    result = subprocess.run([sys.executable, "tools/compare_runs.py", "--run", f"A={tmp_path / 'missing'}",
                             "--output", str(tmp_path / "o")], capture_output=True, text=True)
    assert result.returncode != 0 and "is not a folder" in result.stderr
