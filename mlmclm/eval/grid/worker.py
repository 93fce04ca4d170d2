"""The loop every worker runs: take the longest unit that is neither finished nor claimed, run it under a beating
claim, write its records, and again; when every unit left is claimed by others, wait and take over any whose
worker stopped beating; end when every unit is finished or failed.

A unit that raises is recorded as failed (claims.ClaimStore.fail, with the error's last lines) and the worker goes
on with the others: a grid of 330 runs is not lost to one. A failed unit is not run again by this command (nor by
any command that started before the failure), so a deterministic error fails once, not once per worker.
SIGTERM and SIGUSR1 (a preemption: Slurm's, torchrun's) raise `Preempted` in the worker: it drops its unit,
removes its claim so others take the unit at once, and ends (exit 75 in a worker process).
"""
from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mlmclm.eval.grid.claims import ClaimStore, Heartbeat
from mlmclm.eval.grid.units import Unit, finished_records, run_unit

PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL, as training's preemption exit (a scheduler requeues it)
INTERRUPTED_EXIT_CODE = 130
POLL_SECONDS = 1.0  # how often a worker with nothing to claim looks again
ERROR_LINES = 12  # of the traceback kept in failed/<unit>.json


class Preempted(BaseException):
    """SIGTERM or SIGUSR1 arrived: stop now, give the unit back. A BaseException, as KeyboardInterrupt is, so that
    no `except Exception` on the way (a unit's failure handling) mistakes it for the unit's own error."""


# The signals that asked this process to stop, also kept here: the exception a handler raises can be swallowed by a
# bare `except:` in a library it lands in (a Ctrl-C'd grid once ran every unit to the end on a loaded CI machine), so
# the loop looks here between units too. Cleared when a loop starts (tests run several grids in one process).
_stop_requested: list[str] = []


def _stop_exception(name: str) -> BaseException:
    return KeyboardInterrupt() if name == "SIGINT" else Preempted(name)


# True while a worker takes a claim: a stop that lands there is remembered and raised as the claim-taking ends,
# inside the block that gives the claim back (raised between the claim file's create and that block, it would leave
# the claim behind: seen once under load, where the create's fsync is slow).
_deferring = [False]


def raise_preempted(signum, frame) -> None:
    name = signal.Signals(signum).name
    _stop_requested.append(name)
    if not _deferring[0]:
        raise Preempted(name)


def raise_interrupted(signum, frame) -> None:
    """Ctrl-C in a grid that runs its units in its own process: KeyboardInterrupt, as Python's default, remembered."""
    _stop_requested.append("SIGINT")
    if not _deferring[0]:
        raise KeyboardInterrupt


@contextmanager
def _stops_deferred():
    _deferring[0] = True
    try:
        yield
    finally:
        _deferring[0] = False
    if _stop_requested:
        raise _stop_exception(_stop_requested[0])


PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


@dataclass
class WorkerReport:
    ran: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)  # runs whose claim was taken over meanwhile


def _failed_since(store: ClaimStore, unit: Unit, started_at: float) -> bool:
    failure = store.failure(unit.id)
    return bool(failure) and failure.get("fingerprint") == unit.fingerprint and failure.get("when", 0) >= started_at


def next_unit(units: list[Unit], output_dir: Path, store: ClaimStore, started_at: float, done: set[str]
              ) -> tuple[Unit | None, bool]:
    """(a unit this worker now holds, whether any unit is left at all). Finished units go into `done`."""
    left = False
    for unit in units:
        if unit.id in done:
            continue
        if finished_records(unit, output_dir) is not None:
            done.add(unit.id)
            continue
        if _failed_since(store, unit, started_at):
            continue
        left = True
        if store.claim(unit.id, unit.fingerprint) or store.take_over(unit.id, unit.fingerprint):
            if finished_records(unit, output_dir) is not None:  # finished between our look and our claim
                store.release(unit.id)
                done.add(unit.id)
                continue
            return unit, True
    return None, left


def work(units: list[Unit], output_dir: Path, store: ClaimStore, started_at: float,
         poll_seconds: float = POLL_SECONDS) -> WorkerReport:
    """Runs units until none is left (see the module). `units`: longest first."""
    report, done = WorkerReport(), set()
    _stop_requested.clear()
    while True:
        if _stop_requested:  # a stop whose exception a library swallowed: the unit it hit finished, no other starts
            raise _stop_exception(_stop_requested[0])
        unit = None
        try:
            with _stops_deferred():
                unit, left = next_unit(units, output_dir, store, started_at, done)
            if unit is None:
                if not left:
                    return report
                time.sleep(poll_seconds)  # every unit left is someone else's for now
                continue
            store.clear_failure(unit.id)  # an earlier command's failure: this is its one more try
            try:
                with Heartbeat(store, unit.id) as heartbeat:
                    written = run_unit(unit, output_dir, store.worker,
                                       keep=lambda: not heartbeat.lost.is_set() and store.holds(unit.id))
            except Exception:  # the unit's own error: recorded, and the worker goes on
                store.fail(unit.id, unit.fingerprint,
                           "".join(traceback.format_exc().splitlines(True)[-ERROR_LINES:]))
                report.failed.append(unit.id)
                print(f"evaluate: {unit.id} failed (worker {store.worker}): "
                      f"{traceback.format_exc().strip().splitlines()[-1]}", file=sys.stderr, flush=True)
                continue
            if written:
                store.release(unit.id)
                report.ran.append(unit.id)
                done.add(unit.id)
            else:
                report.dropped.append(unit.id)
                print(f"evaluate: {unit.id}: worker {store.worker} lost its claim while running it (it stopped "
                      f"beating for over {store.stale_s:g} s and another worker took the unit over); its result is "
                      f"dropped", file=sys.stderr, flush=True)
        except BaseException:  # Preempted, KeyboardInterrupt: the unit goes back to the queue (no-op once released)
            if unit is not None:
                store.release(unit.id)
            raise


@dataclass
class WorkerPayload:
    """What a spawned worker process needs (pickled through the spawn)."""

    units: list[Unit]
    output_dir: Path
    started_at: float
    threads: int


def worker_main_from_stdin() -> None:
    """A worker interpreter's entry (spawn.spawn_worker): its payload, pickled by its own command, on stdin. An
    empty one: the command ended without handing it work (it was started early, spawn.start_early): nothing to do."""
    import pickle

    data = sys.stdin.buffer.read()
    if not data:
        os._exit(0)
    worker_main(pickle.loads(data))


def worker_main(payload: WorkerPayload) -> None:
    """A worker process: its exit code is the grid contract's (0 done, 1 a unit failed, 75 preempted, 130
    interrupted)."""
    import torch

    torch.set_num_threads(payload.threads)
    for signum in PREEMPTION_SIGNALS:
        signal.signal(signum, raise_preempted)
    signal.signal(signal.SIGINT, _interrupt_once)
    store = ClaimStore(payload.output_dir)
    try:
        code = 1 if work(payload.units, payload.output_dir, store, payload.started_at).failed else 0
    except Preempted:
        code = PREEMPTED_EXIT_CODE
    except KeyboardInterrupt:
        code = INTERRUPTED_EXIT_CODE
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # everything is on disk: no wait on the interpreter's teardown (tokenizers' threads, torch's hooks)


def _interrupt_once(signum, frame) -> None:
    """Ctrl-C reaches a worker twice (from the terminal, and forwarded by its command): the first one stops it, the
    second must not interrupt its clean-up."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise_interrupted(signum, frame)
