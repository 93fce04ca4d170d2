"""The optimizer update behind the non-finite guard, decided at the step's one host read.

megatron's `optimizer.step()` prepares the main gradients, computes their global norm (read on the host unless TE's
multi-tensor kernels are there), clips and updates, in one call. A guard in front of it needed its own pass over
every gradient (`isfinite`) and its own host read: 12 % of a CPU step at the paper's vocabulary, and on a GPU one
more point per step where the host waits for the device. The gradient norm already is the guard: the sum of squares
is finite exactly when every gradient is (a finite gradient whose square overflows fp32, |g| > 1.8e19, counts as
diverged too). So the step is split into megatron's own parts, and only the norm's read is ours:

    prepare_main_grads(optimizer)                        # megatron's prepare_grads (no read without a loss scaler)
    norm_sq = squared_grad_norm(optimizer)               # on the device, reduced over the grad-stats group
    ... read [loss stats, norm_sq, stop flag] once ...
    if finite: clip_and_update(optimizer, norm_sq ** .5)  # megatron's clipping formula, step_with_ready_grads

That re-implements the order of `ChainedOptimizer.step` (megatron-core 0.19) for what we configure: no loss scaler
(bf16/fp32), no precision-aware optimizer, no separate gradient-norm groups (multi-token prediction), no
`grad_norm_skip_threshold`, no zero counting. `check_supported` refuses an optimizer outside that, instead of
training differently from megatron.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from megatron.core.optimizer.optimizer import GRAD_NORM_GROUP_ATTR

from mlmclm.parallel.runtime import current_device


def _parts(optimizer) -> list:
    """The optimizers that hold parameters (megatron wraps them in a ChainedOptimizer, possibly of one)."""
    parts = getattr(optimizer, "chained_optimizers", [optimizer])
    return [part for part in parts if not getattr(part, "is_stub_optimizer", False)]


def check_supported(optimizer) -> None:
    """Raise for a megatron optimizer whose step does more than `clip_and_update` re-implements."""
    for part in _parts(optimizer):
        config = part.config
        if getattr(part, "grad_scaler", None) is not None:
            raise NotImplementedError("the guarded update has no loss-scaler (fp16) path; use bf16 or fp32")
        if math.isfinite(getattr(config, "grad_norm_skip_threshold", math.inf)):
            raise NotImplementedError("the guarded update does not implement grad_norm_skip_threshold")
        if getattr(config, "log_num_zeros_in_grad", False):
            raise NotImplementedError("the guarded update does not count zero gradients")
        if config.use_precision_aware_optimizer:  # its gradients live in `decoupled_grad`, not `grad`
            raise NotImplementedError("the guarded update does not support the precision-aware optimizer")
        if any(getattr(p, GRAD_NORM_GROUP_ATTR, None) is not None for p in part.get_parameters()):
            raise NotImplementedError("the guarded update has no separately clipped gradient-norm groups (MTP)")


def prepare_main_grads(optimizer) -> None:
    """Copy the model's gradients to the optimizer's main gradients (megatron's `prepare_grads`)."""
    found_inf = optimizer.prepare_grads()
    if found_inf:  # only a loss scaler reports one, and check_supported refuses those
        raise RuntimeError("prepare_grads reported non-finite gradients: a loss scaler is active")


@torch.no_grad()
def squared_grad_norm(optimizer) -> torch.Tensor:
    """0-dim fp32 on the device: the squared global 2-norm of the main gradients megatron clips by.

    The same gradients as megatron's `get_grad_norm` (`get_grads_for_grad_norm`: shared and tensor-parallel
    duplicate parameters counted once) and the same reduction (sum of squares over the grad-stats group: the whole
    world with the distributed optimizer, the model-parallel group without), but nothing is read on the host."""
    grads = [grad for part in _parts(optimizer) for grad in part.get_grads_for_grad_norm()]
    if grads:
        total = torch.nn.utils.get_total_norm(grads, norm_type=2.0).float().square()
    else:  # this rank owns no gradient shard; it still joins the reduction
        total = torch.zeros((), dtype=torch.float32, device=current_device())
    # A ChainedOptimizer's group is its parts' shared one (megatron refuses parts with different groups).
    dist.all_reduce(total, group=optimizer.get_grad_stats_parallel_group())
    return total


@torch.no_grad()
def clip_and_update(optimizer, grad_norm: float) -> None:
    """Clip the main gradients by the (finite) global norm and update: `ChainedOptimizer.step` after its norm.

    megatron's coefficient, max_norm / (norm + 1e-6), applied only below 1 as megatron does; the scaling is one
    in-place multi-tensor multiply (megatron's own call falls back to a multiply and a copy per tensor without
    apex/TE's kernel, 6 % of a CPU step at the paper's vocabulary)."""
    for part in _parts(optimizer):
        grads = [p.grad for p in part.get_parameters() if p.grad is not None]
        coefficient = part.config.clip_grad / (grad_norm + 1.0e-6)
        if grads and part.config.clip_grad > 0.0 and coefficient < 1.0:
            torch._foreach_mul_(grads, coefficient)
    optimizer.step_with_ready_grads()
