"""Preemption signals: a stop request agreed by every rank, and a checkpoint writer that the signal cannot kill.

How clusters deliver a preemption: Slurm (`--signal=USR1@120`) or the scheduler signals the srun step; torchrun's
agent forwards SIGTERM/SIGUSR1 to each worker's whole *process group* (`os.killpg`). That group also holds the helper
process megatron's checkpoint writer starts (a `multiprocessing` manager serving the write-results queue, created at
the first save and kept for the run). Killed by the group signal, it takes the save down with it. So:
- the worker turns the signal into a flag, agreed on by every rank at the next step boundary (`StopRequest`);
- the helper is started by us, ignoring the stop signals and set to die with its parent (`PR_SET_PDEATHSIG`), so it neither dies early nor outlives the worker;
- saves run with the stop signals blocked, so any other child a save forks inherits the same protection, and the
  worker sees the signal (its handler runs) as soon as the save is over.
"""
from __future__ import annotations

import contextlib
import logging
import signal
import sys
import types

import torch
import torch.distributed as dist

from mlmclm.parallel.runtime import current_device
from mlmclm.train.shielded_helper import STOP_SIGNALS, shield_helper

log = logging.getLogger(__name__)


class StopRequest:
    """SIGTERM / SIGUSR1 ask for a save at the next step boundary, then a clean exit."""

    def __init__(self, signals=STOP_SIGNALS):
        """`signals=()` installs no handler: the flag is still made and reduced every step (a benchmark running
        pretrain's step must stay killable by its own timeout's SIGTERM)."""
        self.requested = False
        self._flag: torch.Tensor | None = None
        for sig in signals:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.requested = True

    def agreed_flag(self) -> torch.Tensor:
        """[1] int32 on the device, nonzero when any rank was asked to stop: the reduction is launched here and
        read by the caller with the step's other numbers (`train_step(stop_flag=...)`), not on its own.

        One tensor for the run, refilled in place: `torch.tensor([...], device=cuda)` each step copied from pageable
        host memory, a copy that waits for everything queued on the GPU (the whole backward) — a second host
        synchronisation per step. `fill_` with a Python number is a kernel launch taking the value as an argument."""
        if self._flag is None:
            self._flag = torch.zeros(1, dtype=torch.int32, device=current_device())  # NCCL: on the GPU
        self._flag.fill_(int(self.requested))
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX)  # any rank's signal stops every rank at the same step
        return self._flag


@contextlib.contextmanager
def stop_signals_blocked():
    """Hold SIGTERM/SIGUSR1 pending for the duration (children started meanwhile inherit the blocked mask)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def start_checkpoint_writer_helper() -> None:
    """Create megatron's write-results queue ourselves, in a helper shielded as the module docstring says.

    megatron-core 0.19 keeps the queue in `filesystem_async._results_queue` and creates it lazily (unshielded) at the
    first save; setting it first is the only hook it offers. Without that attribute (another version) nothing is
    done and the save blocks the signals itself, which protects a helper started during the save as well.
    """
    import multiprocessing as mp

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if not hasattr(filesystem_async, "_results_queue"):
        log.warning("megatron's checkpoint writer has no _results_queue: its helper is shielded only during saves")
        return
    if filesystem_async._results_queue is not None:
        return
    global _writer_manager
    from multiprocessing.managers import SyncManager

    _writer_manager = SyncManager(ctx=mp.get_context("spawn"))  # what megatron would start, plus the shield
    with _main_module_hidden():
        _writer_manager.start(initializer=shield_helper)
    filesystem_async._results_queue = _writer_manager.Queue()


_writer_manager = None  # kept referenced for the life of the process


@contextlib.contextmanager
def _main_module_hidden():
    """A spawned child first re-imports the parent's `__main__` module (for `python -m nemo_run...fdl_runner`, all of
    NeMo-Run: ~8 s of CPU per rank, measured) so that pickled functions defined there resolve. The helper needs
    nothing from it, so the start sees an empty `__main__`, which spawn does not re-import."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main
