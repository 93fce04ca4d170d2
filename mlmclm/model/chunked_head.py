"""Chunked output layer + vocab-parallel cross entropy: the logits of a few tokens at a time, never of them all.

At the paper's 128,256-token vocabulary the `[tokens, vocab]` logits dwarf everything else a step holds (5.8 GB in
bf16 at 22.5k tokens, before the fp32 copies megatron's loss makes and the logits' gradient). `ChunkedLinearCE`
runs the output layer and the cross entropy over `chunk_tokens` rows at a time: the forward keeps, per token,
only the log of the softmax's normaliser (max + log of the sum of exponentials, one fp32 number); the backward
recomputes each chunk's logits
from the hidden states and the weight, turns them into the softmax gradient and multiplies it out at once. So no
tensor larger than `[chunk_tokens, vocab / tp]` fp32 ever exists, at the price of one more output-layer matmul
(the recomputation) per step.

The arithmetic is megatron's `vocab_parallel_cross_entropy`, chunk by chunk, on each rank's vocabulary shard:
logits cast to fp32, the max all-reduced (MAX) over the tensor-parallel group and subtracted, the label's
logit picked where it lies in this shard, exponentiated and summed, then the label logit and the sum all-reduced
(SUM; one collective for both); loss = log(sum) - label logit. Token accuracy comes from the same numbers for free:
a token is right when its label's logit is the global max (shifted: when it is >= 0), as `correct_predictions`
counts it from the full logits.

`chunked_head_loss` is a `GPTModel` output processor (as `mlmclm.model.sparse_head`): it receives the final
hidden states on the last pipeline stage, gathers the sequence-parallel shards (backward: reduce-scatter, as the
output layer's own SP path) or copies them into the tensor-parallel region (backward: all-reduce), and runs the
function over every position (CLM, or MLM without the sparse head) or over the labelled positions only (MLM's
sparse head). Same loss and gradients as megatron's head within float reassociation: a speed setting, free to
change on resume.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core.tensor_parallel import copy_to_tensor_model_parallel_region, gather_from_sequence_parallel_region

# 256 tokens: at vocab 128256 one chunk's fp32 logits are 125 MiB per TP rank (the full logits of a paper-sized
# 22.5k-token micro-batch: 11 GiB), and the weight gradient is accumulated once per chunk. Chosen, not tuned: on
# the 2-core development machine, under the load of other jobs, a sweep of 128-1024 was noise-dominated (see
# docs/performance.md); a GPU sweep is still to be made.
DEFAULT_CHUNK_TOKENS = 256


def validate_chunk_tokens(value) -> int:
    """The chunk size: whole tokens, >= 1 (0 is the config's 'megatron's own head')."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"head chunk size must be a whole number of tokens >= 1, got {value!r}")
    return value


def _tp_info(group) -> tuple[int, int]:
    if group is None or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _all_reduce(tensor: torch.Tensor, op, group, world: int) -> None:
    if world > 1:
        dist.all_reduce(tensor, op=op, group=group)


class ChunkedLinearCE(torch.autograd.Function):
    """losses, correct = ChunkedLinearCE.apply(hidden [n, h], weight [v/tp, h], labels [n], chunk_tokens, group)

    `weight` is this rank's vocabulary shard (rows `rank * v/tp` onwards), `labels` global token ids; `losses` are
    fp32 per token (differentiable in `hidden` and `weight`), `correct` 0/1 per token (not differentiable). The
    caller makes `hidden` the same on every rank of `group` and sums its gradient over them (the TP region)."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk_tokens: int, group):
        rank, world = _tp_info(group)
        shard = weight.shape[0]
        start = rank * shard
        n = hidden.shape[0]
        losses = torch.empty(n, dtype=torch.float32, device=hidden.device)
        correct = torch.empty(n, dtype=torch.float32, device=hidden.device)
        log_normaliser = torch.empty(n, dtype=torch.float32, device=hidden.device)  # max + log(sum of exp)
        chunk = _ChunkBuffers(min(chunk_tokens, n), weight)
        for lo in range(0, n, chunk_tokens):
            hi = min(lo + chunk_tokens, n)
            logits = chunk.logits(hidden[lo:hi], weight)  # [c, v/tp] fp32, this chunk's buffer
            row_max = logits.max(dim=-1).values
            _all_reduce(row_max, dist.ReduceOp.MAX, group, world)
            logits -= row_max.unsqueeze(-1)
            local, in_shard = _local_labels(labels[lo:hi], start, shard)
            picked = logits.gather(-1, local.unsqueeze(-1)).squeeze(-1) * in_shard
            torch.exp(logits, out=logits)
            both = torch.stack([picked, logits.sum(dim=-1)])
            _all_reduce(both, dist.ReduceOp.SUM, group, world)
            picked, total = both[0], both[1]
            log_total = torch.log(total)
            losses[lo:hi] = log_total - picked
            correct[lo:hi] = (picked >= 0).float()
            log_normaliser[lo:hi] = row_max + log_total
        ctx.save_for_backward(hidden, weight, labels, log_normaliser)
        ctx.chunk_tokens, ctx.start = chunk_tokens, start
        ctx.mark_non_differentiable(correct)
        return losses, correct

    @staticmethod
    def backward(ctx, grad_losses, _grad_correct):
        hidden, weight, labels, log_normaliser = ctx.saved_tensors
        chunk_tokens, start, shard, n = ctx.chunk_tokens, ctx.start, weight.shape[0], hidden.shape[0]
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        # Summed over chunks in fp32 (one rounding to the weight's dtype at the end, as one big matmul would).
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        if grad_losses is None:
            grad_losses = torch.zeros_like(log_normaliser)
        chunk = _ChunkBuffers(min(chunk_tokens, n), weight)
        for lo in range(0, n, chunk_tokens):
            hi = min(lo + chunk_tokens, n)
            # The softmax, recomputed from the forward's per-token max + log(sum): exp(logits - that).
            grad = chunk.logits(hidden[lo:hi], weight)
            grad -= log_normaliser[lo:hi].unsqueeze(-1)
            torch.exp(grad, out=grad)
            local, in_shard = _local_labels(labels[lo:hi], start, shard)
            rows = torch.arange(hi - lo, device=grad.device)
            grad[rows, local] -= in_shard
            grad *= grad_losses[lo:hi].unsqueeze(-1)
            grad = chunk.in_compute_dtype(grad)
            if need_hidden:
                torch.matmul(grad, weight, out=grad_hidden[lo:hi])
            if need_weight:
                if grad.dtype == torch.float32:
                    grad_weight.addmm_(grad.t(), hidden[lo:hi])
                else:
                    grad_weight += (grad.t() @ hidden[lo:hi]).float()
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None


class _ChunkBuffers:
    """One chunk's logits buffers, reused by every chunk (a fresh multi-hundred-MB tensor per chunk costs the
    allocator, and on CPU the kernel's page zeroing): fp32, plus the compute dtype's when that is not fp32."""

    def __init__(self, rows: int, weight: torch.Tensor):
        shape = (max(rows, 1), weight.shape[0])
        self.float32 = torch.empty(shape, dtype=torch.float32, device=weight.device)
        self.compute = (None if weight.dtype == torch.float32
                        else torch.empty(shape, dtype=weight.dtype, device=weight.device))

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rows = hidden.shape[0]
        if self.compute is None:
            return torch.mm(hidden, weight.t(), out=self.float32[:rows])
        out = self.float32[:rows]
        out.copy_(torch.mm(hidden, weight.t(), out=self.compute[:rows]))
        return out

    def in_compute_dtype(self, grad: torch.Tensor) -> torch.Tensor:
        if self.compute is None:
            return grad
        out = self.compute[:grad.shape[0]]
        out.copy_(grad)
        return out


def _local_labels(labels: torch.Tensor, start: int, shard: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels as indices into this rank's shard (0 where outside it) and 1.0/0.0 for inside/outside."""
    local = labels - start
    inside = (local >= 0) & (local < shard)
    return torch.where(inside, local, torch.zeros_like(local)), inside.float()


@dataclass
class ChunkedHead:
    """`output_processor_context` for `chunked_head_loss`. `positions`: flat indices into the sequence-major
    [s * b] grid (`sparse_head.flat_positions`) for the sparse MLM head, or None for every position. The
    processor leaves the micro-batch's correct-prediction count in `correct` (the loss function logs it)."""

    chunk_tokens: int
    positions: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None  # [b, s], every position's head: which of them count for accuracy
    correct: torch.Tensor | None = None


def chunked_head_loss(*, hidden_states, output_layer, output_weight, labels, context: ChunkedHead, config,
                      **_unused):
    """`GPTModel` output processor: per-token losses, [b, s] for every position or [1, n] at `context.positions`
    (with `labels` already selected, as for `sparse_head_loss`). The count of correct predictions (at
    `context.loss_mask`'s positions; every selected position counts) is left in `context.correct`."""
    if getattr(config, "use_mup", False):
        raise NotImplementedError("the chunked head does not scale logits (MuP): set head_chunk_tokens: 0")
    weight = output_weight if output_weight is not None else output_layer.weight
    group = output_layer.tp_group
    if output_layer.sequence_parallel:
        hidden_states = gather_from_sequence_parallel_region(hidden_states, tensor_parallel_output_grad=True,
                                                             group=group)
    else:
        hidden_states = copy_to_tensor_model_parallel_region(hidden_states, group=group)
    seq, batch = hidden_states.shape[0], hidden_states.shape[1]
    flat = hidden_states.reshape(seq * batch, hidden_states.shape[-1])
    if context.positions is not None:
        flat = flat.index_select(0, context.positions)
        targets = labels.reshape(-1)
    else:
        targets = labels.transpose(0, 1).reshape(-1)  # [b, s] -> the sequence-major order of `flat`
    losses, correct = ChunkedLinearCE.apply(flat, weight, targets, context.chunk_tokens, group)
    if context.positions is not None:
        context.correct = correct.sum()
        return losses.unsqueeze(0)
    losses = losses.reshape(seq, batch).transpose(0, 1)
    correct = correct.reshape(seq, batch).transpose(0, 1)
    context.correct = (correct * context.loss_mask).sum() if context.loss_mask is not None else correct.sum()
    return losses
