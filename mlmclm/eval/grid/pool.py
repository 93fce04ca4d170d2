"""The worker processes of one grid command: `--workers 1` runs the worker loop in the command's own process;
`--workers N` starts N fresh interpreters (spawned, not forked: a forked child would inherit a CUDA context and
the parent's threads; and not through multiprocessing's spawn, which imports the command's own script, megatron
and all, in every worker: seconds each), each handed its work (the units, pickled) on its standard input. On GPUs
each worker sees one GPU (`CUDA_VISIBLE_DEVICES`: the i-th of those the command sees, round robin); on CPUs the
workers split the cores (`torch.set_num_threads(cores // N)`, at least one each; `threads` sets it). On CPU a run's
numbers depend on its torch threads (reductions split across threads round differently), not on the number of
workers: runs with the same threads per worker give the same records bit for bit.

SIGTERM and SIGUSR1 to the command are passed to every worker, which drops its unit and its claim (worker.py);
SIGINT too (a terminal's Ctrl-C reaches them as well: a worker takes the first one only). A worker that dies
otherwise (killed, out of memory) is replaced, up to MAX_REPLACEMENTS times per slot; its claim names a process
that is gone, so the unit it held is taken over at once by whichever worker looks first.
"""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlmclm.eval.grid.claims import ClaimStore
from mlmclm.eval.grid.units import Unit
from mlmclm.eval.grid.worker import (INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE, PREEMPTION_SIGNALS, Preempted,
                                     WorkerPayload, raise_interrupted, raise_preempted, work)
from mlmclm.parallel.runtime import gpu_count

MAX_REPLACEMENTS = 2  # per worker slot: a unit that kills its worker every time is not retried without end
ENDED_NORMALLY = (0, 1, PREEMPTED_EXIT_CODE, INTERRUPTED_EXIT_CODE)


@dataclass
class PoolResult:
    stopped: str | None = None  # the signal that stopped the command ("SIGTERM", "SIGUSR1", "SIGINT"), if any
    codes: list[int] = field(default_factory=list)  # each worker's last exit code
    lost: list[str] = field(default_factory=list)  # "worker 2 (pid 123): killed by SIGKILL", one per death
    pids: list[int] = field(default_factory=list)  # every worker process this command ran (its own, with one)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def worker_settings(workers: int, device: str, threads: int | None = None) -> list[tuple[dict[str, str], int]]:
    """Per worker: the environment it starts with and its torch threads."""
    threads = threads or max(1, usable_cores() // workers)
    if device != "cuda":
        return [({}, threads)] * workers
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    visible = visible or [str(i) for i in range(gpu_count())]
    return [({"CUDA_VISIBLE_DEVICES": visible[i % len(visible)]}, threads) for i in range(workers)]


WORKER_COMMAND = "from mlmclm.eval.grid.worker import worker_main_from_stdin; worker_main_from_stdin()"


def start_worker(payload: WorkerPayload, env_changes: dict[str, str]) -> subprocess.Popen:
    """A worker interpreter that imports what it needs (not this command's script) and reads its payload from its
    standard input; it finds mlmclm where this process found it."""
    import mlmclm

    env = {**os.environ, **env_changes}
    root = str(Path(mlmclm.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    process = subprocess.Popen([sys.executable, "-c", WORKER_COMMAND], stdin=subprocess.PIPE, env=env)
    # fed from a thread: the pipe takes 64 KiB, and the worker reads only once its imports are done (seconds): the
    # next worker must not wait for that
    threading.Thread(target=_feed, args=(process, pickle.dumps(payload)), daemon=True, name="grid-feed").start()
    return process


def _feed(process: subprocess.Popen, data: bytes) -> None:
    try:
        process.stdin.write(data)
        process.stdin.close()
    except (BrokenPipeError, OSError):  # the worker died before reading: its exit code tells
        pass


def run_in_process(units: list[Unit], output_dir: Path, started_at: float, threads: int | None = None) -> PoolResult:
    """The worker loop in this process; SIGTERM/SIGUSR1 stop it as they would a worker process. Ctrl-C
    (KeyboardInterrupt) goes up to the command, as before."""
    import torch

    saved = {signum: signal.signal(signum, raise_preempted) for signum in PREEMPTION_SIGNALS}
    saved[signal.SIGINT] = signal.signal(signal.SIGINT, raise_interrupted)
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(threads or saved_threads)
    try:
        report = work(units, output_dir, ClaimStore(output_dir), started_at)
        return PoolResult(codes=[1 if report.failed else 0], pids=[os.getpid()])
    except Preempted as stop:
        return PoolResult(stopped=str(stop), codes=[PREEMPTED_EXIT_CODE], pids=[os.getpid()])
    finally:
        torch.set_num_threads(saved_threads)
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def run_processes(units: list[Unit], output_dir: Path, started_at: float, workers: int, device: str,
                  threads: int | None = None, poll_seconds: float = 0.5) -> PoolResult:
    settings = worker_settings(workers, device, threads)
    result = PoolResult()
    processes: list = [_Ended(0)] * workers
    replaced = [0] * workers

    def start(slot: int) -> None:
        env, threads = settings[slot]
        payload = WorkerPayload(units=units, output_dir=Path(output_dir), started_at=started_at, threads=threads)
        processes[slot] = start_worker(payload, env)
        result.pids.append(processes[slot].pid)

    def forward(signum, frame) -> None:
        result.stopped = result.stopped or signal.Signals(signum).name
        for process in processes:
            if process.poll() is None:
                os.kill(process.pid, signum)

    saved = {signum: signal.signal(signum, forward) for signum in (*PREEMPTION_SIGNALS, signal.SIGINT)}
    try:
        for slot in range(workers):
            if result.stopped is None:  # a signal while the workers start: no more of them
                start(slot)
        while any(process.poll() is None for process in processes):
            time.sleep(poll_seconds)
            for slot, process in enumerate(processes):
                code = process.poll()
                if isinstance(process, _Ended) or code is None or code in ENDED_NORMALLY:
                    continue
                result.lost.append(f"worker {slot + 1} (pid {process.pid}): {_death(code)}")
                print(f"evaluate: {result.lost[-1]}; the unit it held goes back to the queue", file=sys.stderr,
                      flush=True)
                processes[slot] = _Ended(code)
                if result.stopped is None and replaced[slot] < MAX_REPLACEMENTS:
                    replaced[slot] += 1
                    start(slot)
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    result.codes = [process.poll() for process in processes]
    return result


class _Ended:
    """A slot whose worker died and is not replaced."""

    def __init__(self, code: int):
        self.code, self.pid = code, None

    def poll(self) -> int:
        return self.code


def _death(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"ended with exit code {code}"


def run_pool(units: list[Unit], output_dir: Path, started_at: float, workers: int = 1, device: str = "cpu",
             threads: int | None = None) -> PoolResult:
    """`threads`: torch threads per worker (None: the cores split between the workers; with one worker, torch's
    own default)."""
    if workers < 1 or (threads is not None and threads < 1):
        raise ValueError(f"--workers and --threads must be >= 1, got {workers} and {threads}")
    if workers == 1:
        return run_in_process(units, output_dir, started_at, threads)
    return run_processes(units, output_dir, started_at, workers, device, threads)
