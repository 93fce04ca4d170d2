"""A checkpoint save the filesystem refused, said in a person's words; and the room check made before each save.

megatron's checkpoint writer turns the OS's error into `RuntimeError("An error is caught while starting worker 0,
error: ...")` without chaining it, and DCP wraps that again in a `CheckpointException`: the errno ("No space left on
device") is lost by the time the save fails. So the cause is found in the exception's text when it survived, else
by asking the filesystem the same question again — writing a small probe into the half-written checkpoint before it
is removed — so that what the message quotes is the OS's own words. The message names the directory, the size a
checkpoint of this run takes, the free space there and the last complete checkpoint (which is intact).
"""
from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

SAVE_FAILED_EXIT_CODE = 74  # EX_IOERR: a rank whose checkpoint could not be written (run_status.json: save_failed)
PROBE_BYTES = 1 << 20  # enough to meet a full disk, small enough to fit anywhere that is not full
HEADROOM = 1.05  # the next checkpoint is about the last one's size; a little more for metadata


class CheckpointWriteError(RuntimeError):
    """A save failed on the filesystem (or would not fit); the message says why, where and what is intact."""


def tree_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def free_bytes(directory: Path) -> int:
    return shutil.disk_usage(directory).free


def _errno_in(err: BaseException) -> int | None:
    """An errno carried by `err`, its causes or its text ("[Errno 28] ...")."""
    seen, todo = set(), [err]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno:
            return current.errno
        if match := re.search(r"\[Errno (\d+)\]", str(current)):
            return int(match.group(1))
        todo += [current.__cause__, current.__context__]
        failures = getattr(current, "failures", None)  # DCP's CheckpointException: rank -> (exception, traceback)
        if isinstance(failures, dict):
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
    return None


def probe_errno(directory: Path) -> int | None:
    """Write (then remove) a small file in `directory`: the errno the OS answers with, None when it fits."""
    probe = Path(directory) / ".mlmclm_space_probe"
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * PROBE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as err:
        return err.errno
    finally:
        try:
            probe.unlink()
        except OSError:
            pass
    return None


def cause_of(err: BaseException, staging: Path) -> str:
    """The OS's words for why writing into `staging` failed (probed there when the exception lost them)."""
    code = _errno_in(err)
    if code is None and staging.exists():
        code = probe_errno(staging)
    if code is not None:
        return f"{os.strerror(code)} ({errno.errorcode.get(code, code)})"
    return f"{type(err).__name__}: {err}"


def describe(root: Path, iteration: int, cause: str, checkpoint_bytes: int | None, last: Path | None,
             removed: bool = True) -> str:
    free = free_bytes(root) if root.exists() else None
    size = (f"a checkpoint of this run takes {human_bytes(checkpoint_bytes)}" if checkpoint_bytes
            else "no earlier checkpoint tells this run's checkpoint size")
    room = f"{human_bytes(free)} free there" if free is not None else "its free space unknown"
    intact = (f"the last complete checkpoint is {last} (intact: the same command resumes from it once there is room)"
              if last else "there is no complete checkpoint yet (the same command starts the run afresh)")
    after = " (after removing the unfinished save)" if removed else ""
    return (f"saving checkpoint {root / f'iter_{iteration:07d}'} failed: {cause}; {size}, {room}{after}; {intact}")


def room_error(root: Path, iteration: int, checkpoint_bytes: int, last: Path | None) -> CheckpointWriteError | None:
    """Before a save: an error when the free space under `root` cannot hold another checkpoint of the last one's
    size (with a little headroom), else None."""
    free = free_bytes(root)
    if free >= checkpoint_bytes * HEADROOM:
        return None
    cause = (f"not enough free space for the next checkpoint ({os.strerror(errno.ENOSPC)} would follow), so the "
             f"run stopped before writing it")
    return CheckpointWriteError(describe(root, iteration, cause, checkpoint_bytes, last, removed=False))
