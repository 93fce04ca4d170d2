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



def test_a_segment_ends_saying_it_stopped_as_asked_and_how_to_go_on(uninterrupted_tiny_run, tmp_path, nemo_home,
                                                                     capsys):
    """`checkpoint.stop_at`: the launch's last line says the run stopped on purpose and how it continues, not an
    ETA. The session's finished run resumes from its step-6 checkpoint (the last one removed, as if the run had
    stopped there) on 1 process: two steps trained, not a new run."""
    import shutil

    from recipes.__main__ import main

    finished = uninterrupted_tiny_run
    run_dir = tmp_path / "run"
    shutil.copytree(finished.run_dir, run_dir)
    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "iter_0000006").is_dir()
    shutil.rmtree(checkpoints / f"iter_{finished.steps:07d}")
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("6")
    arguments = ["tiny_clm_mlm", f"steps={finished.steps}", f"run_dir={run_dir}", f"data_path={finished.data}",
                 "executor.gpus=false", "processes=1", "checkpoint.stop_at=8"]
    assert main(arguments) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == ("stopped at step 8 as asked (checkpoint.stop_at); the same command continues, without "
                       "checkpoint.stop_at or with a later one"), out[-6:]
    assert "ETA" not in out[-2] and "ETA" not in out[-3], out[-6:]  # the run's last step line: over, no ETA

    assert main(arguments) == 0  # again: nothing starts, and the console says how to go on
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"{run_dir}: the segment (checkpoint.stop_at) already finished at step 8; nothing to train (without "
        f"checkpoint.stop_at (or with a later one) the same command continues)")
