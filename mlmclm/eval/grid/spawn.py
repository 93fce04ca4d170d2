"""Starting grid worker interpreters, and starting them early: `tools/evaluate.py grid --workers N --device cpu`
starts its N-1 extra workers before its own imports (seconds: torch, transformers, megatron), so that theirs run
beside the command's instead of after it; on 2 cores that start-up was a tenth of a smoke grid's wall time. The pool
(pool.py) hands them their work when it starts. Light on purpose: the command imports this first.

Only on CPUs: on GPUs each worker needs its own `CUDA_VISIBLE_DEVICES`, known once torch has counted the GPUs, and a
GPU's units last minutes, so a worker's start-up is noise there. An early worker the command does not use (a
refusal, an error, nothing left to run) is killed as the command exits; one whose command died reads an empty
payload and ends.
"""
from __future__ import annotations

import argparse
import atexit
import os
import subprocess
import sys
import threading
from pathlib import Path

WORKER_COMMAND = "from mlmclm.eval.grid.worker import worker_main_from_stdin; worker_main_from_stdin()"

_early: list[subprocess.Popen] = []


def spawn_worker(env_changes: dict[str, str]) -> subprocess.Popen:
    """A worker interpreter that imports what it needs (not the command's script) and then reads its payload from
    its standard input; it finds mlmclm where this process found it."""
    import mlmclm

    env = {**os.environ, **env_changes}
    root = str(Path(mlmclm.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    return subprocess.Popen([sys.executable, "-c", WORKER_COMMAND], stdin=subprocess.PIPE, env=env)


def feed(process: subprocess.Popen, data: bytes) -> None:
    """Writes the payload from a thread: the pipe takes 64 KiB, and a worker reads only once its imports are done
    (seconds): the next worker must not wait for that."""
    threading.Thread(target=_write, args=(process, data), daemon=True, name="grid-feed").start()


def _write(process: subprocess.Popen, data: bytes) -> None:
    try:
        process.stdin.write(data)
        process.stdin.close()
    except (BrokenPipeError, OSError):  # the worker died before reading: its exit code tells
        pass


def start_early(argv: list[str]) -> int:
    """For `grid ... --workers N --device cpu` (not --list): starts the N-1 workers that run beside the command's
    own loop, now. Returns how many. Anything it cannot read is left to the command's parser."""
    if not argv or argv[0] != "grid":
        return 0
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--list", action="store_true")
    try:
        known, _ = parser.parse_known_args(argv[1:])
    except (argparse.ArgumentError, SystemExit, ValueError):
        return 0
    # a count far past the cores is left to the pool to start (and the parser to judge): not hundreds at once here
    if known.list or known.device != "cpu" or not 1 < known.workers <= (os.cpu_count() or 1) * 4:
        return 0
    if not _early:
        atexit.register(_kill_unused)
    _early.extend(spawn_worker({}) for _ in range(known.workers - 1))
    return known.workers - 1


def take_early() -> subprocess.Popen | None:
    """One of the workers started early that is still alive, now the pool's; None when there is none."""
    while _early:
        process = _early.pop(0)
        if process.poll() is None:
            return process
    return None


def _kill_unused() -> None:
    for process in _early:
        process.kill()
        process.wait()
    _early.clear()
