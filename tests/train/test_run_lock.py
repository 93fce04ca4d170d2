"""The run lock is exclusive: of two starts at the same moment exactly one holds it, whether the lock was free or
stale (its holder gone), and only its holder releases it. The old lock was check-then-write: two processes calling
RunLock(dir) together both got it in 8 of 20 trials, and release() deleted it whoever held it (issue 56)."""
import json
import multiprocessing
import os
import subprocess
import sys

from mlmclm.train import run_lock

TRIALS = 50


def _racer(folder: str, start, done, results) -> None:
    """One start per trial: take the lock at the barrier, say whether it got it, hold it until both have tried."""
    for trial in range(TRIALS):
        start.wait()
        try:
            lock = run_lock.RunLock(os.path.join(folder, str(trial)))
        except run_lock.RunLockedError:
            lock = None
        results.put((trial, lock is not None))
        done.wait()
        if lock is not None:
            lock.release()


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_of_two_starts_at_once_exactly_one_takes_the_lock_free_or_stale(tmp_path):
    for trial in range(TRIALS // 2, TRIALS):  # half the trials race for a stale lock: its process is gone
        folder = tmp_path / str(trial)
        folder.mkdir()
        (folder / run_lock.LOCK_FILE).write_text(json.dumps(
            {"host": run_lock.socket.gethostname(), "pid": _dead_pid(), "slurm_job": None}))
    context = multiprocessing.get_context("spawn")
    start, done, results = context.Barrier(2), context.Barrier(2), context.Queue()
    racers = [context.Process(target=_racer, args=(str(tmp_path), start, done, results)) for _ in range(2)]
    for racer in racers:
        racer.start()
    got = [results.get(timeout=120) for _ in range(2 * TRIALS)]
    for racer in racers:
        racer.join(timeout=60)
    holders = {trial: sum(ok for t, ok in got if t == trial) for trial in range(TRIALS)}
    assert [t for t, n in holders.items() if n != 1] == [], holders  # never both, never neither
    assert not any((tmp_path / str(t) / run_lock.LOCK_FILE).exists() for t in range(TRIALS))  # each released


def test_only_its_holder_releases_the_lock(tmp_path):
    mine = run_lock.RunLock(tmp_path)
    assert json.loads(mine.path.read_text())["pid"] == os.getpid()
    # another run took it over (this one was judged stale): its lock is not this run's to delete
    theirs = {"host": "node-b", "pid": 7, "slurm_job": "9", "token": "theirs"}
    mine.path.write_text(json.dumps(theirs))
    mine.release()
    assert json.loads(mine.path.read_text()) == theirs
    mine.path.unlink()
    again = run_lock.RunLock(tmp_path)
    again.release()
    assert not again.path.exists()


def test_another_tools_folder_with_an_empty_checkpoints_folder_is_not_a_run_of_ours(tmp_path):
    """Issue 56: a folder holding another tool's metrics.jsonl, run_status.json and notes plus an empty checkpoints/
    was trained into (an empty checkpoints/ counted as ours) and both of that tool's files were overwritten."""
    foreign = tmp_path / "theirs"
    (foreign / "checkpoints").mkdir(parents=True)
    for name in ("metrics.jsonl", "run_status.json", "notes.txt"):
        (foreign / name).write_text("theirs\n")
    try:
        run_lock.check_run_dir_is_ours(foreign)
    except run_lock.ForeignRunDirError as err:
        assert "not empty (checkpoints, metrics.jsonl, notes.txt, run_status.json)" in str(err)
    else:
        raise AssertionError("another tool's folder was taken for a run of ours")
    run_lock.check_run_dir_is_ours(foreign, allowed=True)  # checkpoint.allow_foreign_run_dir=true

    # a run of ours that stopped before its first save: lock released, no iter_* yet, its own status beside it
    ours = tmp_path / "ours"
    run_lock.RunLock(ours / "checkpoints").release()
    (ours / "run_status.json").write_text("{}")
    run_lock.check_run_dir_is_ours(ours)
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    run_lock.check_run_dir_is_ours(empty)  # nothing but an empty checkpoints/: nothing to write among
