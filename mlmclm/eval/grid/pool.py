"""The workers of one grid command: `--workers 1` runs the worker loop in the command's own process; `--workers N`
runs it there too (the command has imported what a worker needs: it starts on units at once) and in N-1 fresh
interpreters beside it (spawned, not forked: a forked child would inherit a CUDA context and the parent's threads;
and not through multiprocessing's spawn, which imports the command's own script, megatron and all, in every worker:
seconds each), each handed its work (the units, pickled) on its standard input. On GPUs each worker sees one GPU:
the i-th of those the command sees, round robin (`CUDA_VISIBLE_DEVICES` for a spawned one; the command's own loop
uses the first it sees); on CPUs the workers split the cores (`torch.set_num_threads(cores // N)`, at least one
each; `threads` sets it). On CPU a run's numbers depend on its torch threads (reductions split across threads round
differently), not on the number of workers or which of them runs it: runs with the same threads per worker give
the same records bit for bit.

SIGTERM and SIGUSR1 to the command are passed to every worker, which drops its unit and its claim (worker.py), and
stop the command's own loop the same way; SIGINT too (a terminal's Ctrl-C reaches them as well: a worker takes the
first one only). A spawned worker that dies otherwise (killed, out of memory) is replaced, up to MAX_REPLACEMENTS
times per slot; its claim names a process that is gone, so the unit it held is taken over at once by whichever
worker looks first.
"""
from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from mlmclm.eval.grid.claims import ClaimStore
from mlmclm.eval.grid.spawn import feed, spawn_worker, take_early
from mlmclm.eval.grid.units import Unit
from mlmclm.eval.grid.worker import (INTERRUPTED_EXIT_CODE, PREEMPTED_EXIT_CODE, PREEMPTION_SIGNALS, Preempted,
                                     WorkerPayload, raise_interrupted, raise_preempted, work)
from mlmclm.parallel.runtime import gpu_count
from mlmclm.progress_log import write_line

MAX_REPLACEMENTS = 2  # per worker slot: a unit that kills its worker every time is not retried without end
ENDED_NORMALLY = (0, 1, PREEMPTED_EXIT_CODE, INTERRUPTED_EXIT_CODE)
_STOPPED_CODES = {"SIGINT": INTERRUPTED_EXIT_CODE, "SIGTERM": PREEMPTED_EXIT_CODE, "SIGUSR1": PREEMPTED_EXIT_CODE}


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
    """Slot 1 is this process: it has imported what a worker needs, so it runs units at once while the N-1 spawned
    workers import (seconds each; on 2 cores a third of a short grid). The others are watched from a thread and
    replaced when they die; a signal is passed to each of them and stops this process's own loop as it stops theirs."""
    import torch

    settings = worker_settings(workers, device, threads)
    result = PoolResult(pids=[os.getpid()])
    others = _SpawnedWorkers(units, output_dir, started_at, settings[1:], result)
    own_loop = threading.Event()

    def on_signal(signum, frame) -> None:
        result.stopped = result.stopped or signal.Signals(signum).name
        others.forward(signum)
        if own_loop.is_set():  # once, and only while this process runs units: not while it waits for the others
            own_loop.clear()
            (raise_interrupted if signum == signal.SIGINT else raise_preempted)(signum, frame)

    saved = {signum: signal.signal(signum, on_signal) for signum in (*PREEMPTION_SIGNALS, signal.SIGINT)}
    saved_threads = torch.get_num_threads()
    try:
        others.start_all()
        own_code = _STOPPED_CODES.get(result.stopped, 0)  # a signal while they started: no unit here
        if result.stopped is None:
            torch.set_num_threads(settings[0][1])
            own_loop.set()
            try:
                own_code = 1 if work(units, output_dir, ClaimStore(output_dir), started_at).failed else 0
            except Preempted:
                own_code = PREEMPTED_EXIT_CODE
            except KeyboardInterrupt:
                own_code = INTERRUPTED_EXIT_CODE
            except BaseException:  # this process's own loop broke: the others give their units back and end too
                own_loop.clear()
                others.forward(signal.SIGTERM)
                others.wait(poll_seconds)
                raise
            own_loop.clear()
        others.wait(poll_seconds)
    finally:
        own_loop.clear()
        torch.set_num_threads(saved_threads)
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    result.codes = [own_code, *others.codes()]
    return result


class _SpawnedWorkers:
    """Slots 2..N of a pool: worker processes, started, watched from a thread and replaced when one dies otherwise
    than by the grid's contract (up to MAX_REPLACEMENTS times per slot), sent the signals the command gets."""

    def __init__(self, units: list[Unit], output_dir: Path, started_at: float,
                 settings: list[tuple[dict[str, str], int]], result: PoolResult):
        self.units, self.output_dir, self.started_at, self.settings = units, Path(output_dir), started_at, settings
        self.result = result
        self.processes: list = [_Ended(0)] * len(settings)
        self.replaced = [0] * len(settings)
        self._watcher: threading.Thread | None = None

    def start_all(self) -> None:
        for slot in range(len(self.settings)):
            if self.result.stopped is None:  # a signal while the workers start: no more of them
                self._start(slot)
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="grid-workers")
        self._watcher.start()

    def _start(self, slot: int) -> None:
        env, threads = self.settings[slot]
        payload = WorkerPayload(units=self.units, output_dir=self.output_dir, started_at=self.started_at,
                                threads=threads)
        # a worker the command started before its own imports (CPU only: no environment of its own), else a new one
        process = (not env and take_early()) or spawn_worker(env)
        feed(process, pickle.dumps(payload))
        self.processes[slot] = process
        self.result.pids.append(process.pid)
        if self.result.stopped is not None:  # the stop came while it started: it gets it too
            os.kill(process.pid, signal.SIGTERM)

    def forward(self, signum: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.kill(process.pid, signum)

    def _watch(self, poll_seconds: float = 0.5) -> None:
        while any(process.poll() is None for process in self.processes):
            time.sleep(poll_seconds)
            for slot, process in enumerate(self.processes):
                code = process.poll()
                if isinstance(process, _Ended) or code is None or code in ENDED_NORMALLY:
                    continue
                self.result.lost.append(f"worker {slot + 2} (pid {process.pid}): {_death(code)}")
                write_line(f"evaluate: {self.result.lost[-1]}; the unit it held goes back to the queue")
                self.processes[slot] = _Ended(code)
                if self.result.stopped is None and self.replaced[slot] < MAX_REPLACEMENTS:
                    self.replaced[slot] += 1
                    self._start(slot)

    def wait(self, poll_seconds: float) -> None:
        """Until every worker ended (in steps: a signal handler must get to run meanwhile)."""
        while self._watcher is not None and self._watcher.is_alive():
            self._watcher.join(poll_seconds)

    def codes(self) -> list[int | None]:
        return [process.poll() for process in self.processes]


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
