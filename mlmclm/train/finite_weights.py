"""A checkpoint is saved only from finite weights.

An update can leave the weights NaN or infinite while its own loss was finite (a huge learning rate, an overflow
in the optimizer step): the loss guard (guarded_update) sees it only at the next steps, after a periodic save may
already have written the NaN model — which a resume, `init_from`, a branch or an export would then take as good.
Before each save every rank checks its own parameters (one pass over them, small next to writing them) and the
ranks agree: a non-finite one stops the run without saving, naming the parameter, so every checkpoint this trainer
writes held finite weights when it was written.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from mlmclm.parallel.runtime import current_device


class NonFiniteWeightsError(RuntimeError):
    """The weights hold NaN or an infinity at a save: nothing was saved."""


def first_nonfinite(modules) -> str | None:
    """The name of the first parameter of `modules` holding a NaN or an infinity, or None."""
    for index, module in enumerate(modules):
        for name, param in module.named_parameters():
            if not bool(torch.isfinite(param.detach()).all()):
                return f"{name} (model chunk {index})" if len(modules) > 1 else name
    return None


def check_finite_weights(modules, iteration: int, last: Path | None) -> None:
    """On every rank before a save: raise NonFiniteWeightsError on all ranks when any rank's weights are not all
    finite (`last`: the last complete checkpoint, named as where a resume would start)."""
    bad = first_nonfinite(modules)
    flag = torch.tensor([int(bad is not None)], dtype=torch.int32, device=current_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        where = f"parameter {bad}" if bad is not None else "a parameter on another rank"
        before = (f"the last checkpoint, {last}, was saved before them" if last is not None
                  else "no checkpoint was saved before them")
        raise NonFiniteWeightsError(f"step {iteration}: the weights hold NaN or infinity ({where}): not saved as a "
                                    f"checkpoint; {before} (a learning rate too high, or an overflow in the update)")
