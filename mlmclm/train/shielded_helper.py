"""What runs first in the checkpoint writer's helper process (see `mlmclm.train.signals`).

A module of its own, importing nothing heavy: the helper is a spawned interpreter that imports the module of its
initializer, and through `signals` that would be torch — seconds of CPU per rank and per start, for a process that
only serves a queue."""
import ctypes
import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


def shield_helper() -> None:
    """Ignore the stop signals — process-wide, since threads the imports started would take a merely blocked one —
    and exit when the worker that started it dies, even by SIGKILL (Linux). (Spawning does not keep the parent's
    signal mask, so this has to run in the helper itself.)"""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the helper still exits at the worker's normal exit
        pass
