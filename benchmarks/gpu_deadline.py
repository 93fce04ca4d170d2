"""A GPU-session section's deadline, enforced from inside its own process.

Each section checks its deadline between the pieces of work it can cut (a speed row, a run, a check). A piece that
outlasts it — a model build, a kernel compilation, a run that hangs — is cut here: at the deadline a timer thread
signals the main thread (SIGUSR2), whose handler raises `DeadlineReached`; the same happens on SIGTERM (the
shell's `timeout` at the section's hard limit). The section's runner (gpu_session.run) then writes what was
measured so far with the status "not reached" — a deadline is never reported as a failure — and kills the process
groups its section started in their own sessions (torchrun agents and their ranks, which the shell's `timeout`,
signalling only the section's group, would leave running on the GPU into the next section).

`DeadlineReached` is a BaseException: the sections' `except Exception` blocks, which record a failure of their own
piece and go on, let it through. A main thread that cannot take the signal — inside one long C call: a tokenizer
batch, a kernel compilation, a hung collective — is not waited for: `GRACE_S` after the signal the timer thread
calls `on_stuck` (the runner writes the section's file and the summary from there) and ends the process.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

_groups: set[int] = set()
_lock = threading.Lock()
GRACE_S = 3.0  # the main thread's time to answer the deadline's signal before the timer thread ends the process


class DeadlineReached(BaseException):
    """The section's deadline (or its hard limit's SIGTERM) came before its work ended."""


def started_group(pgid: int) -> None:
    """A process group the section started in its own session (killed when the section ends, whatever ends it)."""
    with _lock:
        _groups.add(pgid)


def ended_group(pgid: int) -> None:
    with _lock:
        _groups.discard(pgid)


def kill_groups() -> list[int]:
    with _lock:
        groups = sorted(_groups)
        _groups.clear()
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # already gone
            pass
    return groups


def _raise(signum, _frame):
    what = "its hard limit's SIGTERM" if signum == signal.SIGTERM else "its deadline"
    raise DeadlineReached(f"the section was stopped by {what} before its work ended")


@contextlib.contextmanager
def enforced(deadline: float, on_stuck=None):
    """Within the block (main thread only), `DeadlineReached` is raised at `deadline` (time.monotonic()) or on
    SIGTERM; on leaving it, every process group the section started is killed. If the block has not ended GRACE_S
    after the deadline's signal, `on_stuck()` runs on the timer thread, the groups are killed and the process ends
    (exit status 0: the section did what it could, and said so)."""
    main = threading.main_thread().ident
    previous = {sig: signal.signal(sig, _raise) for sig in (signal.SIGUSR2, signal.SIGTERM)}
    done = threading.Event()

    def fire():
        if done.wait(max(0.0, deadline - time.monotonic())):
            return
        signal.pthread_kill(main, signal.SIGUSR2)
        if done.wait(GRACE_S):
            return
        try:
            if on_stuck is not None:
                on_stuck()
        finally:
            kill_groups()
            os._exit(0)

    timer = threading.Thread(target=fire, name="section-deadline", daemon=True)
    timer.start()
    try:
        yield
    finally:
        done.set()  # the timer stands down; if it fired just now, its signal is handled (and dropped) here
        try:
            timer.join()
            time.sleep(0)
        except DeadlineReached:  # the work had ended: it was reached
            pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            kill_groups()
