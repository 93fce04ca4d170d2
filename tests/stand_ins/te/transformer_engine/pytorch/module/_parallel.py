"""The communication TE's `_Linear` / `_LayerNormLinear` autograd functions run around their GEMMs
(`module/linear.py`, `module/layernorm_linear.py`, TE 2.20), as autograd functions over the collectives of
`transformer_engine.pytorch.distributed`:

| layer                 | forward                         | backward of the input                  |
|-----------------------|---------------------------------|----------------------------------------|
| column, SP            | all-gather along the sequence   | reduce-scatter of dgrad                |
| column, no SP, TP > 1 | nothing                         | all-reduce of dgrad                    |
| row, SP               | reduce-scatter of the output    | all-gather of the output's gradient    |
| row, no SP, TP > 1    | all-reduce of the output        | nothing                                |

TE fuses these with its GEMMs (and overlaps them with userbuffers); only the arithmetic they amount to is here.
"""
from __future__ import annotations

import torch

from transformer_engine.pytorch.distributed import allreduce, gather_along_first_dim, reduce_scatter_along_first_dim


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, group):
        ctx.group = group
        return gather_along_first_dim(inp, group)[0]

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_along_first_dim(grad, ctx.group)[0], None


class _ReduceScatterSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, group):
        ctx.group = group
        return reduce_scatter_along_first_dim(inp, group)[0]

    @staticmethod
    def backward(ctx, grad):
        return gather_along_first_dim(grad, ctx.group)[0], None


class _AllReduceForward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, group):
        return allreduce(inp.clone(), group)[0]

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _AllReduceBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp, group):
        ctx.group = group
        return inp

    @staticmethod
    def backward(ctx, grad):
        return allreduce(grad.clone(), ctx.group)[0], None


def column_input(inp: torch.Tensor, parallel_mode, sequence_parallel: bool, tp_size: int, group) -> torch.Tensor:
    """The GEMM input of a column-parallel layer: the whole sequence."""
    if parallel_mode != "column" or tp_size == 1:
        return inp
    if sequence_parallel:
        return _GatherSequence.apply(inp, group)
    return _AllReduceBackward.apply(inp, group)


def row_output(out: torch.Tensor, parallel_mode, sequence_parallel: bool, tp_size: int, group) -> torch.Tensor:
    """A row-parallel layer's output: the partial sums reduced (and, with SP, scattered along the sequence)."""
    if parallel_mode != "row" or tp_size == 1:
        return out
    if sequence_parallel:
        return _ReduceScatterSequence.apply(out, group)
    return _AllReduceForward.apply(out, group)
