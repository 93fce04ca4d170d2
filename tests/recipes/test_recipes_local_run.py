"""`tiny_clm_mlm` through NeMo-Run's LocalExecutor: 2 torchrun CPU processes, checkpoint and TensorBoard logs."""
import json
import re
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from recipes import launch
from recipes.progress import RunProgress


def _every_second(init):
    def fast(self, *args, **kwargs):
        init(self, *args, **{**kwargs, "interval": 1.0})
    return fast


def test_tiny_clm_mlm_runs_with_the_local_executor(nemo_home, tmp_path, tiny_data, capsys, monkeypatch):
    run_dir = tmp_path / "run"
    partial, _ = launch.build("tiny_clm_mlm", ["steps=6", f"run_dir={run_dir}", f"data_path={tiny_data}"])
    monkeypatch.setattr(RunProgress, "__init__", _every_second(RunProgress.__init__))
    launch.launch([("tiny_clm_mlm", partial)], "local", {"gpus": False})
    # the console shows the run, not only NeMo-Run's status: its start, steps with losses, where its outputs are
    console = capsys.readouterr().out
    assert f"{run_dir}: new run of 6 steps" in console
    assert re.search(r"step +6/6 \[mlm\] loss \d+\.\d+.*tok/s", console), console
    assert f"metrics: {run_dir / 'metrics.jsonl'}; TensorBoard:" in console

    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text().strip() == "6"
    final = checkpoints / "iter_0000006"
    assert (final / "metadata.json").exists()
    state = json.loads((final / "train_state.json").read_text())
    assert (state["iteration"], state["phase_name"]) == (6, "mlm")
    assert (checkpoints / "iter_0000002").exists()  # the CLM phase's end (25 % of 6 steps, rounded)

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"clm/loss", "mlm/loss", "optimisation/lr"} <= tags  # mlmclm/tensorboard_tags.py
    assert [e.step for e in events.Scalars("clm/loss")] == [1, 2]
    assert [e.step for e in events.Scalars("mlm/loss")] == [3, 4, 5, 6]
    # NeMo-Run kept the torchrun logs of both ranks.
    assert len({p.parent.name for p in Path(nemo_home).rglob("attempt_0/*/stderr.log")}) == 2


def test_a_failed_task_prints_its_own_error(nemo_home, tmp_path, capsys):
    """The task fails inside torchrun (an unreadable manifest); the launcher's console names the task's own error."""
    broken = tmp_path / "broken_data"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")
    from recipes.__main__ import main

    rc = main(["tiny_clm_mlm", "steps=4", "processes=1", f"data_path={broken}", f"run_dir={tmp_path / 'run'}",
               "executor.gpus=false"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "task tiny_clm_mlm: FAILED" in err
    assert f"cannot read dataset manifest {broken / 'manifest.json'}" in err
