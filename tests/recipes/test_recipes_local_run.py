"""`tiny_clm_mlm` through NeMo-Run's LocalExecutor: 2 torchrun CPU processes, checkpoint and TensorBoard logs."""
import json
import re
from pathlib import Path

from mlmclm.eval.reports.tensorboard_logs import read_scalars
from recipes import launch


def test_tiny_clm_mlm_runs_with_the_local_executor(uninterrupted_tiny_run):
    run_dir, steps = uninterrupted_tiny_run.run_dir, uninterrupted_tiny_run.steps
    # the console shows the run, not only NeMo-Run's status: its start, steps with losses, where its outputs are
    console = uninterrupted_tiny_run.console
    assert f"{run_dir}: new run of {steps} steps" in console
    assert re.search(rf"step +{steps}/{steps} \[mlm\] loss \d+\.\d+.*tok/s", console), console
    assert f"metrics: {run_dir / 'metrics.jsonl'}; TensorBoard:" in console
    # NeMo-Run's banners and live status panel stay out of the terminal (the progress lines say more)
    assert "Entering Experiment" not in console and "Waiting for Experiment" not in console, console
    assert "SUCCEEDED" not in console and "╭" not in console, console

    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == str(steps)
    final = checkpoints / f"iter_{steps:07d}"
    assert (final / "metadata.json").exists()
    state = json.loads((final / "train_state.json").read_text())
    assert (state["iteration"], state["phase_name"]) == (steps, "mlm")
    assert (checkpoints / "iter_0000003").exists()  # the CLM phase's end (25 % of 12 steps)

    scalars = read_scalars(run_dir / "tensorboard")
    assert {"clm/loss", "mlm/loss", "optimisation/lr"} <= set(scalars)  # mlmclm/tensorboard_tags.py
    assert list(scalars["clm/loss"].steps) == [1, 2, 3]
    assert list(scalars["mlm/loss"].steps) == list(range(4, steps + 1))
    # TensorBoard names the run after its directory (events in RUN/tensorboard/NAME, a phase per folder below)
    assert {p.name for p in (run_dir / "tensorboard" / run_dir.name).iterdir() if p.is_dir()} == {"clm", "mlm"}
    # NeMo-Run kept the torchrun logs of both ranks.
    assert len({p.parent.name for p in uninterrupted_tiny_run.nemo_home.rglob("attempt_0/*/stderr.log")}) == 2

