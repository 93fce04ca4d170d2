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
import secrets
import socket
import time
from pathlib import Path

from mlmclm.atomic_write import write_atomic

log = logging.getLogger(__name__)

LOCK_FILE = ".writer.lock"
# Left in the checkpoint folder by the first start of a run and never removed: a run of ours that stopped before its
# first save (its lock released, no iter_* yet) still says whose the folder is; an empty checkpoints/ says nothing.
RUN_MARKER = ".mlmclm-run"
STALE_AFTER_S = 900  # no step in 15 min (longer than any save we have measured): its holder is gone
TAKEOVER_STALE_S = 60  # a takeover takes milliseconds: a guard this old was left by a start that died in it


class RunLockedError(RuntimeError):
    pass


class ForeignRunDirError(RunLockedError):
    """The run directory is not empty and holds no run of ours: training would write among someone else's files."""


def _first_names(path: Path, count: int = 1000) -> list[str]:
    """Up to `count` names in the folder `path` (enough to judge and show it, however large it is)."""
    with os.scandir(path) as entries:
        return [entry.name for _, entry in zip(range(count), entries)]


def _is_our_checkpoint_dir(path: Path) -> bool:
    """A checkpoint folder as our runs leave it: holding our marker, lock, pointer or iteration folders. A run of
    ours has the marker and the lock from its first moment (rank 0 takes the lock there before anything else is
    written). An empty one is anyone's: another tool's folder with an empty checkpoints/ was trained into."""
    if not path.is_dir():
        return False
    return any(name in (RUN_MARKER, LOCK_FILE, "latest_checkpointed_iteration.txt")
               or name.startswith(("iter_", ".staging_iter_")) for name in _first_names(path))


def check_run_dir_is_ours(run_dir: str | Path, allowed: bool = False) -> None:
    """Refuse a run directory that exists, is not empty and holds no run of ours (unless `allowed`): a mistyped
    run_dir pointing at a home, data or another tool's folder would get checkpoints written among its files and its
    `metrics.jsonl` (another tool's, maybe) rewritten."""
    path = Path(run_dir)
    if allowed or not path.is_dir():
        return
    names = sorted(_first_names(path))
    if names == ["checkpoints"] and not _first_names(path / "checkpoints"):
        return  # an empty folder holding an empty checkpoints/: nothing of anyone's to write among
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
    """Held by rank 0 for the life of a run; `touch()` each step, `release()` at exit.

    Taken with an exclusive create (O_EXCL): of several starts at the same moment exactly one creates the file, the
    others find it held. A stale lock is taken over under a second exclusive file (`.takeover`), after checking that
    the lock is still the one judged stale, so two starts cannot both take it over. Each holder writes a random
    token, and `release()` removes the lock only while it still holds that token."""

    def __init__(self, checkpoint_dir: Path):
        self.path = Path(checkpoint_dir) / LOCK_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.holder = {**_holder(), "token": secrets.token_hex(16)}
        for _ in range(3):  # a stale lock removed, then created again: another start may win that create
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(self.holder))
            marker = self.path.with_name(RUN_MARKER)
            if not marker.exists():
                write_atomic(marker, "checkpoints of an mlmclm run (mlmclm/train/run_lock.py)\n")
            return
        raise RunLockedError(f"{self.path.parent}: another run took the lock while this one was starting")

    def _read(self) -> tuple[dict, os.stat_result, str] | None:
        """The lock's holder, its stat and text; None when it is gone."""
        try:
            stat, text = self.path.stat(), self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            held = json.loads(text)
        except json.JSONDecodeError:  # being written by its creator this instant, or torn: judged by its age
            held = {}
        return (held if isinstance(held, dict) else {}), stat, text

    def _take_over_if_stale(self) -> None:
        """Remove the lock if its holder is gone (RunLockedError if it is alive, or another start is taking it)."""
        found = self._read()
        if found is None:
            return
        held, stat, text = found
        reason = _stale_reason(held, time.time() - stat.st_mtime)
        if reason is None:
            raise RunLockedError(
                f"{self.path.parent} is being written by another run (host {held.get('host')}, pid "
                f"{held.get('pid')}, Slurm job {held.get('slurm_job')}); stop it first, or delete {self.path} "
                f"if you know it is gone")
        guard = self.path.with_name(LOCK_FILE + ".takeover")
        try:
            fd = os.open(guard, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            try:
                if time.time() - guard.stat().st_mtime > TAKEOVER_STALE_S:  # its taker died mid-way
                    guard.unlink(missing_ok=True)
                    return
            except FileNotFoundError:
                return
            raise RunLockedError(f"{self.path.parent}: another run is taking over its stale lock right now") from None
        try:
            now = self._read()
            # still the lock judged stale? Another start may have taken it over and created its own meanwhile
            if now is not None and (now[1].st_ino, now[2]) == (stat.st_ino, text):
                self.path.unlink()
                log.info("taking over a stale lock on %s: %s", self.path.parent, reason)
        finally:
            os.close(fd)
            guard.unlink(missing_ok=True)

    def holds(self) -> bool:
        found = self._read()
        return found is not None and found[0].get("token") == self.holder["token"]

    def touch(self) -> None:
        os.utime(self.path)

    def release(self) -> None:
        """Remove the lock if this run still holds it; one another run took over (ours judged stale) is left."""
        if self.holds():
            self.path.unlink(missing_ok=True)
        elif self.path.exists():
            log.warning("%s is held by another run now: left in place", self.path)


def remove_staging_leftovers(checkpoint_dir: Path) -> list[str]:
    """Delete torn saves (call while holding the lock). Returns their names."""
    import shutil

    removed = []
    for staging in sorted(Path(checkpoint_dir).glob(".staging_iter_*")):
        shutil.rmtree(staging, ignore_errors=True)
        removed.append(staging.name)
    return removed
