"""Ctrl-C on a local launch: stop the run the way a preemption does (save at the next step boundary, then exit).

NeMo-Run's local executor starts torchrun, and torchrun each rank, in a session of its own, so the SIGINT a terminal
sends to its foreground process group reaches only this launcher: the ranks never hear it. Left alone, Python turns
it into a KeyboardInterrupt inside NeMo-Run's wait loop (a traceback, the run still training). Here the first press
sends SIGTERM to each rank's process group — what torchrun's agent does with a preemption signal, so the ranks agree
on a stop, save and exit 75 (`mlmclm.train.signals`) — and the launcher keeps waiting for them; later presses only
say that the save is being finished. Tasks not started yet (a chain, a sweep) are not started.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C


class LocalInterrupt:
    """While active (main thread only), SIGINT forwards a stop to the ranks of this process's torchrun children."""

    def __init__(self, console):
        self.console = console
        self.presses = 0
        self.signalled: set[int] = set()  # pids already sent the stop
        self._previous = None

    @property
    def requested(self) -> bool:
        return self.presses > 0

    def __enter__(self) -> LocalInterrupt:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)

    def _say(self, text: str) -> None:
        self.console.write(text + "\n")
        self.console.flush()

    def _handle(self, signum, frame) -> None:
        self.presses += 1
        self.signalled.update(forward_stop(skip=self.signalled))  # also a rank started since an earlier press
        if self.presses == 1:
            self._say("\nstopping: the run saves at the next step boundary, then exits (a second Ctrl-C does not "
                      "interrupt the save)")
        else:
            self._say("\nstopping: still finishing the save; the run exits as soon as its checkpoint is written")


def forward_stop(skip: set[int] = frozenset()) -> list[int]:
    """SIGTERM to the process group of every rank of this process's torchrun children (to a child itself while it
    has no rank yet: torchrun then shuts down without starting them). Returns the pids signalled."""
    import psutil

    sent = []
    for agent in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            for target in agent.children() or [agent]:
                if target.pid in skip:
                    continue
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(target.pid, signal.SIGTERM)  # each rank leads its own session and group
                    sent.append(target.pid)
    return sent


def no_new_tasks(interrupt: LocalInterrupt):
    """After a Ctrl-C, NeMo-Run's local DAG would still start the tasks of the next level (a chain's second task,
    the sweep's next run) once the stopped one has exited: they stay unlaunched instead."""
    return launches_skipped(lambda job: interrupt.requested)


@contextlib.contextmanager
def launches_skipped(skip):
    """While active, NeMo-Run's Job.launch of a job for which `skip(job)` is true is skipped: the job stays
    unlaunched (and NeMo-Run waits for nothing). Dry runs are never skipped."""
    from nemo_run.run.job import Job

    original = Job.launch

    def launch_unless_skipped(job, *args, **kwargs):
        if not kwargs.get("dryrun") and skip(job):
            return None
        return original(job, *args, **kwargs)

    Job.launch = launch_unless_skipped
    try:
        yield
    finally:
        Job.launch = original
