"""TE's tensor-parallel helpers (`transformer_engine/pytorch/distributed.py`, TE 2.x), on torch.distributed (gloo on
CPU, as NCCL on a GPU).

Modelled, as TE implements them:
- `gather_along_first_dim` / `reduce_scatter_along_first_dim` / `allreduce`: the collectives TE's linears run for
  sequence and tensor parallelism, along the first (sequence) dimension, returning `(tensor, handle)`; a group of
  one is bypassed; a first dimension that does not divide by the group size is refused with TE's message;
- `set_tensor_model_parallel_attributes`: the `tensor_model_parallel` / `partition_dim` / `partition_stride`
  attributes megatron's optimizer and checkpointing read, refused when already set (TE's check);
- `activation_recompute_forward` and the recompute-phase queries megatron imports at load (no FP8: nothing to
  save between the two forward passes).
Not modelled: FP8/MXFP8/NVFP4 gathers, asynchronous handles (`async_op=True` completes at once and returns a
finished work object), userbuffers, symmetric memory, CUDA RNG states (`CudaRNGStatesTracker` refuses use: megatron
takes it only with `use_te_rng_tracker`, which mlmclm leaves off), TE's `checkpoint`.
"""
from __future__ import annotations

from contextlib import AbstractContextManager, ContextDecorator

import torch
import torch.distributed as dist

_ACTIVATION_RECOMPUTE_PHASE = False


def get_distributed_world_size(group=None) -> int:
    if not dist.is_initialized():
        return 1
    return dist.get_world_size(group=group)


def get_distributed_rank(group=None) -> int:
    if not dist.is_initialized():
        return 0
    return dist.get_rank(group=group)


def set_tensor_model_parallel_attributes(tensor: torch.Tensor, is_parallel: bool, dim: int, stride: int) -> None:
    for attribute in ("tensor_model_parallel", "partition_dim", "partition_stride"):
        if hasattr(tensor, attribute):
            raise RuntimeError(f"Tensor already has attribute '{attribute}' set. Cannot set tensor model parallel "
                               "attributes on a tensor that already has them.")
    tensor.tensor_model_parallel = is_parallel
    tensor.partition_dim = dim
    tensor.partition_stride = stride


def _refuse_async(async_op: bool) -> None:
    if async_op:
        raise NotImplementedError("the TE stand-in runs its collectives synchronously (async_op=True not modelled)")


def gather_along_first_dim(inp: torch.Tensor, process_group, async_op: bool = False, quantizer=None,
                           output: torch.Tensor | None = None):
    if quantizer is not None:
        raise NotImplementedError("the TE stand-in models no FP8 all-gather")
    _refuse_async(async_op)
    world_size = get_distributed_world_size(process_group)
    if world_size == 1:
        return inp, None
    shape = list(inp.shape)
    shape[0] *= world_size
    out = torch.empty(shape, dtype=inp.dtype, device=inp.device) if output is None else output
    dist.all_gather_into_tensor(out, inp.contiguous(), group=process_group)
    return out, None


def reduce_scatter_along_first_dim(inp: torch.Tensor, tp_group, async_op: bool = False,
                                   output: torch.Tensor | None = None):
    _refuse_async(async_op)
    world_size = get_distributed_world_size(tp_group)
    if world_size == 1:
        return inp, None
    shape = list(inp.shape)
    if shape[0] % world_size != 0:
        raise ValueError("First dimension of the tensor should be divisible by tensor parallel size, "
                         f"but got dim_size[0]={shape[0]} and world_size={world_size} "
                         f"(remainder={shape[0] % world_size}).")
    shape[0] //= world_size
    out = torch.empty(shape, dtype=inp.dtype, device=inp.device) if output is None else output
    dist.reduce_scatter_tensor(out, inp.contiguous(), group=tp_group)
    return out, None


def allreduce(inp: torch.Tensor, tp_group=None, async_op: bool = False):
    _refuse_async(async_op)
    if get_distributed_world_size(tp_group) == 1:
        return inp, None
    dist.all_reduce(inp, group=tp_group)
    return inp, None


class activation_recompute_forward(AbstractContextManager, ContextDecorator):
    """Marks the recompute phase of TE's activation checkpointing (FP8 bookkeeping only; none here)."""

    def __init__(self, activation_recompute: bool = False, recompute_phase: bool = False):
        super().__init__()
        self.activation_recompute = activation_recompute
        self.recompute_phase = recompute_phase

    def __enter__(self):
        global _ACTIVATION_RECOMPUTE_PHASE
        _ACTIVATION_RECOMPUTE_PHASE = self.activation_recompute and self.recompute_phase
        return self

    def __exit__(self, *exc):
        global _ACTIVATION_RECOMPUTE_PHASE
        _ACTIVATION_RECOMPUTE_PHASE = False


def is_fp8_activation_recompute_enabled() -> bool:
    return False


def in_fp8_activation_recompute_phase() -> bool:
    return _ACTIVATION_RECOMPUTE_PHASE


class CudaRNGStatesTracker:
    """The class megatron's `TECudaRNGStatesTracker` subclasses at import. Not modelled: CUDA RNG states."""

    def __init__(self):
        self.states_, self.seeds_ = {}, set()

    def reset(self):
        self.states_, self.seeds_ = {}, set()

    def get_states(self):
        return dict(self.states_)

    def set_states(self, states):
        raise NotImplementedError("the TE stand-in models no CUDA RNG states (megatron's use_te_rng_tracker)")

    def add(self, name, seed):
        raise NotImplementedError("the TE stand-in models no CUDA RNG states (megatron's use_te_rng_tracker)")

    def fork(self, name="model-parallel-rng"):
        raise NotImplementedError("the TE stand-in models no CUDA RNG states (megatron's use_te_rng_tracker)")


def checkpoint(*args, **kwargs):
    raise NotImplementedError("the TE stand-in models no activation checkpointing (megatron's recompute with TE)")
