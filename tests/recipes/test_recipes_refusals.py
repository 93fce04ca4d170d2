"""What the launcher's console shows when the trainer refuses a run, through NeMo-Run's real LocalExecutor.

A refusal (mlmclm.train.refusals: an incompatible resume, bad data) reaches `python -m recipes`'s console as the
trainer's own message, once, without a traceback, exit 2, and run_status.json says `refused` with it; a finished
run re-launched with a changed setting is refused the same way before any process starts (it used to say "already
finished" and exit 0, ignoring the change). A real bug still shows its traceback. Each test copies the session's
finished 12-step run (`uninterrupted_tiny_run`) and launches 1 rank at most, since megatron's start-up dominates.
"""
import json
import shutil

import pytest

from mlmclm.data.manifest import Manifest
from mlmclm.train import checkpoint as ckpt
from mlmclm.train.resume_check import IncompatibleCheckpointError, check_resume_from
from recipes import launch
from recipes.base import validate
from recipes.__main__ import main


def _finished_copy(finished, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(finished.run_dir, run_dir)
    return run_dir


def _arguments(finished, run_dir, *settings):
    return ["tiny_clm_mlm", f"run_dir={run_dir}", f"data_path={finished.data}", "executor.gpus=false", *settings]


def _resume_refusal(arguments, run_dir) -> str:
    """The message the resume checks give for these settings, asked in this process."""
    partial, _ = launch.build(arguments[0], arguments[1:])
    cfg = validate(partial)
    with pytest.raises(IncompatibleCheckpointError) as refused:
        check_resume_from(cfg, ckpt.latest_checkpoint(run_dir / "checkpoints"), Manifest.load(cfg.data.path))
    return str(refused.value)


def test_a_finished_run_relaunched_with_a_changed_seed_is_refused_and_unchanged_says_finished(
        uninterrupted_tiny_run, tmp_path, nemo_home, capsys):
    finished = uninterrupted_tiny_run
    run_dir = _finished_copy(finished, tmp_path)
    steps = f"steps={finished.steps}"

    changed = _arguments(finished, run_dir, steps, "seed=99")
    expected = _resume_refusal(changed, run_dir)
    assert "data.seed is 1234 in the checkpoint but 99 here; seed is 1234 in the checkpoint but 99 here" in expected
    # the way forward is a new run, not allow_resume_changes (which led into a second refusal, then "nothing to train")
    assert expected.endswith("is a new run: give it a new run_dir (run_dir=...)"), expected
    assert "allow_resume_changes" not in expected, expected
    assert main(changed) == 2
    out, err = capsys.readouterr()
    assert err == f"error: {expected}\n", err
    assert "already finished" not in out, out
    assert main([*changed, "checkpoint.allow_resume_changes=[data.seed,seed]"]) == 2  # allowed: still a new run
    out, err = capsys.readouterr()
    assert "already finished" not in out and err.endswith("give it a new run_dir (run_dir=...)\n"), (out, err)
    assert not nemo_home.exists() or not any(nemo_home.rglob("attempt_*")), "a process was started"

    assert main(_arguments(finished, run_dir, steps)) == 0  # the same settings: finished, nothing to train
    out, err = capsys.readouterr()
    assert f"{run_dir}: the run already finished at step {finished.steps}; nothing to train" in out, out
    assert err == "", err


def test_a_resume_the_trainer_refuses_prints_its_message_once_and_records_refused(
        uninterrupted_tiny_run, tmp_path, nemo_home, capsys):
    finished = uninterrupted_tiny_run
    run_dir = _finished_copy(finished, tmp_path)
    arguments = _arguments(finished, run_dir, f"steps={finished.steps + 8}", "seed=99", "processes=1")
    expected = _resume_refusal(arguments, run_dir)

    assert main(arguments) == 2
    err = capsys.readouterr().err
    assert err == f"error: task tiny_clm_mlm refused: {expected}\n", err  # no traceback, no rank log tail
    assert json.loads((run_dir / "run_status.json").read_text()) == {"status": "refused", "step": None,
                                                                    "detail": expected}
    assert ckpt.latest_checkpoint(run_dir / "checkpoints").name == f"iter_{finished.steps:07d}"  # left as it was


def test_bad_data_is_a_refusal(nemo_home, tmp_path, capsys):
    """The task refuses inside torchrun (an unreadable manifest); the launcher's console shows that message alone."""
    broken = tmp_path / "broken_data"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")

    rc = main(["tiny_clm_mlm", "steps=4", "processes=1", f"data_path={broken}", f"run_dir={tmp_path / 'run'}",
               "executor.gpus=false"])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith(f"error: task tiny_clm_mlm refused: cannot read dataset manifest {broken / 'manifest.json'}")
    assert err.count("cannot read dataset manifest") == 1 and "Traceback" not in err, err
    status = json.loads((tmp_path / "run" / "run_status.json").read_text())
    assert status["status"] == "refused" and status["detail"] in err, (status, err)


def test_a_run_directory_another_run_holds_is_refused_from_the_ranks_own_words(
        uninterrupted_tiny_run, tmp_path, nemo_home, capsys):
    """run_status.json belongs to the run holding the directory, so the launcher reads the refusal the rank printed
    (mlmclm.train.refusals.REFUSAL_MARK in its log) and leaves the holder's status as it was."""
    import os
    import socket
    import subprocess

    from mlmclm.train.run_lock import LOCK_FILE

    finished = uninterrupted_tiny_run
    run_dir = _finished_copy(finished, tmp_path)
    status_before = (run_dir / "run_status.json").read_text()
    with subprocess.Popen(["sleep", "300"]) as holder:
        try:
            (run_dir / "checkpoints" / LOCK_FILE).write_text(json.dumps(
                {"host": socket.gethostname(), "pid": holder.pid, "slurm_job": None}))
            rc = main(_arguments(finished, run_dir, f"steps={finished.steps + 8}", "processes=1",
                                 "checkpoint.allow_resume_changes=[total_steps,schedule]"))
        finally:
            holder.kill()
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith(f"error: task tiny_clm_mlm refused: {run_dir / 'checkpoints'} is being written by another "
                          f"run (host {socket.gethostname()}, pid {holder.pid}"), err
    assert err.count("is being written by another run") == 1 and "Traceback" not in err, err
    assert (run_dir / "run_status.json").read_text() == status_before  # the holder's, untouched
    assert os.path.exists(run_dir / "checkpoints" / LOCK_FILE)  # not taken over while its holder lived


def test_a_real_bug_still_shows_its_traceback(uninterrupted_tiny_run, tmp_path, nemo_home, capsys):
    """A train state without its iteration is read by nothing that expects it (a KeyError nobody raised on purpose):
    it stands for any unexpected exception, which is a failure shown with the rank's traceback."""
    finished = uninterrupted_tiny_run
    run_dir = _finished_copy(finished, tmp_path)
    state_file = ckpt.latest_checkpoint(run_dir / "checkpoints") / ckpt.TRAIN_STATE
    state = json.loads(state_file.read_text())
    del state["iteration"]
    state_file.write_text(json.dumps(state))
    allowed = "checkpoint.allow_resume_changes=[total_steps,schedule]"

    rc = main(_arguments(finished, run_dir, f"steps={finished.steps + 8}", "processes=1", allowed))
    err = capsys.readouterr().err
    assert rc == 1
    assert "task(s) did not succeed" in err and "task tiny_clm_mlm: FAILED" in err, err
    assert "KeyError: 'iteration'" in err and "refused" not in err, err
    status = json.loads((run_dir / "run_status.json").read_text())
    assert status["status"] == "failed" and status["detail"] == "KeyError: 'iteration'", status
