"""One writer per run directory: a lock file that rank 0 holds while training, and what a start may clean up.

A save that died (kill -9, node failure) leaves `.staging_iter_*` under the checkpoint directory. It may be
removed only when no other run is writing there, which is what this lock tells: it names the host, process and
Slurm job of its holder and is touched at every step. A lock is stale when its process is gone (same host), when it
belongs to this same Slurm job (a requeue), or when it has not been touched for `STALE_AFTER_S` (another host, where
liveness cannot be asked). A live one stops the start, naming its holder.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path

from mlmclm.atomic_write import write_atomic

log = logging.getLogger(__name__)

LOCK_FILE = ".writer.lock"
STALE_AFTER_S = 900  # no step in 15 min (longer than any save we have measured): its holder is gone


class RunLockedError(RuntimeError):
    pass


class ForeignRunDirError(RunLockedError):
    """The run directory is not empty and holds no run of ours: training would write among someone else's files."""


def _first_names(path: Path, count: int = 1000) -> list[str]:
    """Up to `count` names in the folder `path` (enough to judge and show it, however large it is)."""
    with os.scandir(path) as entries:
        return [entry.name for _, entry in zip(range(count), entries)]


def _is_our_checkpoint_dir(path: Path) -> bool:
    """A checkpoint folder as our runs leave it: empty, or holding our lock, pointer or iteration folders. A run
    of ours has one from its first moment (rank 0 takes the lock there before anything else is written)."""
    if not path.is_dir():
        return False
    names = _first_names(path)
    return not names or any(name in (LOCK_FILE, "latest_checkpointed_iteration.txt")
                            or name.startswith(("iter_", ".staging_iter_")) for name in names)


def check_run_dir_is_ours(run_dir: str | Path, allowed: bool = False) -> None:
    """Refuse a run directory that exists, is not empty and holds no run of ours (unless `allowed`): a mistyped
    run_dir pointing at a home, data or another tool's folder would get checkpoints written among its files and its
    `metrics.jsonl` (another tool's, maybe) rewritten."""
    path = Path(run_dir)
    if allowed or not path.is_dir():
        return
    names = sorted(_first_names(path))
    if names and not _is_our_checkpoint_dir(path / "checkpoints"):
        shown = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise ForeignRunDirError(
            f"run_dir {path} is not empty ({shown}) and holds no run of ours (no checkpoints/ folder of ours): "
            f"refusing to train among someone else's files; choose a new or empty directory, or set "
            f"checkpoint.allow_foreign_run_dir=true to train there anyway")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _holder() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "slurm_job": os.environ.get("SLURM_JOB_ID")}


def _stale_reason(held: dict, age_s: float) -> str | None:
    me = _holder()
    if held.get("host") == me["host"]:
        return None if _pid_alive(int(held.get("pid", -1))) else f"process {held.get('pid')} is gone"
    if held.get("slurm_job") and held.get("slurm_job") == me["slurm_job"]:
        return f"it belongs to this Slurm job {me['slurm_job']} (requeued)"
    if age_s > STALE_AFTER_S:
        return f"untouched for {age_s:.0f} s"
    return None


class RunLock:
    """Held by rank 0 for the life of a run; `touch()` each step, `release()` at exit."""

    def __init__(self, checkpoint_dir: Path):
        self.path = Path(checkpoint_dir) / LOCK_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            try:
                held = json.loads(self.path.read_text())
            except (json.JSONDecodeError, OSError):
                held = {}
            reason = _stale_reason(held, time.time() - self.path.stat().st_mtime)
            if reason is None:
                raise RunLockedError(
                    f"{self.path.parent} is being written by another run (host {held.get('host')}, pid "
                    f"{held.get('pid')}, Slurm job {held.get('slurm_job')}); stop it first, or delete {self.path} "
                    f"if you know it is gone")
            log.info("taking over a stale lock on %s: %s", self.path.parent, reason)
        write_atomic(self.path, json.dumps(_holder()))

    def touch(self) -> None:
        os.utime(self.path)

    def release(self) -> None:
        self.path.unlink(missing_ok=True)


def remove_staging_leftovers(checkpoint_dir: Path) -> list[str]:
    """Delete torn saves (call while holding the lock). Returns their names."""
    import shutil

    removed = []
    for staging in sorted(Path(checkpoint_dir).glob(".staging_iter_*")):
        shutil.rmtree(staging, ignore_errors=True)
        removed.append(staging.name)
    return removed
