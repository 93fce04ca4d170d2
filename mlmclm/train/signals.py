"""Preemption signals: a stop request agreed by every rank, and saves the signal cannot interrupt.

How clusters deliver a preemption: Slurm (`--signal=USR1@120`) or the scheduler signals the srun step; torchrun's
agent forwards SIGTERM/SIGUSR1 to each worker's whole *process group* (`os.killpg`). Whatever else lives in that
group gets the signal too: megatron's checkpoint writer used to start a helper process there (a `multiprocessing`
manager for its write results), which the signal killed, taking the save down with it. The writer's results now stay
in the rank's own process (`checkpoint.save_sharded`), so a save starts no process. So:
- the worker turns the signal into a flag, agreed on by every rank at the next step boundary (`StopRequest`);
- saves run with the stop signals blocked, so any child a save might start inherits the same protection, and the
  worker sees the signal (its handler runs) as soon as the save is over.
"""
from __future__ import annotations

import contextlib
import signal

import torch
import torch.distributed as dist

from mlmclm.parallel.runtime import current_device

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


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
