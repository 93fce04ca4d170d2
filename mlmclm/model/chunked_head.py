"""Chunked output layer + vocab-parallel cross entropy: the logits of a few tokens at a time, never of them all.

At the paper's 128,256-token vocabulary the `[tokens, vocab]` logits dwarf everything else a step holds (5.8 GB in
bf16 at 22.5k tokens, before the fp32 copies megatron's loss makes and the logits' gradient).
`chunked_linear_cross_entropy` runs the output layer and the cross entropy over `chunk_tokens` rows at a time and
returns the loss already reduced as the training step reduces it: the sum over tokens of each token's loss times
its weight (the loss mask; 1 at the sparse head's positions). Because that reduction is known in the forward, the
forward also computes, chunk by chunk while the chunk's softmax is at hand, the gradients of that sum with respect
to the hidden states and the output weight (Liger's fused linear + cross entropy does the same on GPUs). The
backward only multiplies them by the incoming gradient, a scalar: no logits are recomputed, so a step makes the
three output-layer matmuls megatron's head makes (logits, input gradient, weight gradient), not four.

Memory: no tensor larger than one chunk's `[chunk_tokens, vocab / tp]` fp32 shifted logits (and, in bf16, the
chunk's logits and then its gradient in bf16, for the matmuls) ever exists. Held from the forward to the backward,
instead of the inputs: the gradient of the hidden states, `[n, h]` in their dtype, and the gradient of this rank's
weight shard, `[v / tp, h]` in fp32 (summed over the chunks by an fp32-accumulating GEMM, mlmclm.model.wgrad_gemm,
and rounded once, as one big matmul would; with megatron's gradient-accumulation fusion
never rounded: added in fp32 into the weight's `main_grad`, as megatron's fused head does —
mlmclm.model.wgrad_fusion). Without gradients (validation, evaluation:
`torch.no_grad()`, or inputs that do not require them) only the loss is computed: one matmul per chunk.

The arithmetic is megatron's `vocab_parallel_cross_entropy`, chunk by chunk, on each rank's vocabulary shard:
logits cast to fp32, the max all-reduced (MAX) over the tensor-parallel group and subtracted, the label's
logit picked where it lies in this shard, exponentiated and summed, then the label logit and the sum all-reduced
(SUM; one collective for both); loss = log(sum) - label logit; its gradient in the logits is softmax - one-hot,
from the same exponentials. Token accuracy comes from the same numbers for free: a token is right when its label's
logit is the global max (shifted: when it is >= 0), as `correct_predictions` counts it from the full logits.

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

from mlmclm.model.wgrad_fusion import add_to_main_grad, fuses_wgrad
from mlmclm.model.wgrad_gemm import accumulate_wgrad


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                                 token_weights: torch.Tensor | None, chunk_tokens: int, group,
                                 fuse_wgrad: bool = False, bias: torch.Tensor | None = None):
    """loss, losses, correct = chunked_linear_cross_entropy(hidden [n, h], weight [v/tp, h], labels [n],
    token_weights [n] or None, chunk_tokens, group, fuse_wgrad=False, bias=None)

    `loss` is Σ token_weights × per-token cross entropy (fp32, 0-dim; token_weights None = all 1), the only
    differentiable output: its gradient in `hidden` and `weight` is computed in this forward, when grad is enabled
    and they require it. `losses` (fp32) and `correct` (0/1) per token are detached, for logging. `weight` is this
    rank's vocabulary shard (rows `rank * v/tp` onwards), `labels` global token ids. The caller makes `hidden` the
    same on every rank of `group` and sums its gradient over them (the TP region). `fuse_wgrad`: megatron's
    gradient-accumulation fusion (mlmclm.model.wgrad_fusion) — the weight gradient is accumulated in fp32 with
    apex's kernel and added into `weight.main_grad` in the backward, never rounded to the weight's dtype. `bias`
    [v/tp] (ModernBERT's decoder bias; this rank's shard) is added to the logits; its gradient, the column sums of
    the logits' gradient, is summed over the chunks in fp32 like the weight's."""
    if token_weights is not None and token_weights.shape != labels.shape:
        raise ValueError(f"token_weights {tuple(token_weights.shape)} must match labels {tuple(labels.shape)}")
    trainable = [t for t in (hidden, weight, bias) if t is not None]
    if torch.is_grad_enabled() and any(t.requires_grad for t in trainable):
        return _ChunkedLinearCE.apply(hidden, weight, labels, token_weights, chunk_tokens, group, fuse_wgrad, bias)
    with torch.no_grad():
        loss, losses, correct, _, _, _ = _chunk_passes(hidden, weight, bias, labels, token_weights, chunk_tokens,
                                                       group, need=(False, False, False), fuse_wgrad=False)
    return loss, losses, correct


class _ChunkedLinearCE(torch.autograd.Function):
    """The gradients, made in the forward and saved (not the inputs); the backward scales them."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, token_weights, chunk_tokens: int, group, fuse_wgrad: bool, bias):
        need = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[7])
        loss, losses, correct, grad_hidden, grad_weight, grad_bias = _chunk_passes(
            hidden, weight, bias, labels, token_weights, chunk_tokens, group, need=need, fuse_wgrad=fuse_wgrad)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.weight_dtype = weight.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        # The parameter itself, not saved for backward: megatron's fused linear keeps its main_grad in ctx too.
        ctx.fused_weight = weight if fuse_wgrad else None
        ctx.mark_non_differentiable(losses, correct)
        return loss, losses, correct

    @staticmethod
    def backward(ctx, grad_loss, _grad_losses, _grad_correct):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        # Scaled out of place: the saved gradients stay as made (a retained graph's second backward reads them
        # again, and the TP region's all-reduce works in place on what we return).
        if grad_hidden is not None:
            grad_hidden = grad_hidden * grad_loss
        if grad_weight is not None and ctx.fused_weight is not None:
            grad_weight = add_to_main_grad(ctx.fused_weight, grad_weight, grad_loss)
        elif grad_weight is not None:  # scaled and rounded in one pass: no second fp32 [v, h]
            grad_weight = torch.mul(grad_weight, grad_loss, out=torch.empty_like(grad_weight, dtype=ctx.weight_dtype))
        if grad_bias is not None:
            grad_bias = (grad_bias * grad_loss).to(ctx.bias_dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, grad_bias


def _chunk_passes(hidden, weight, bias, labels, token_weights, chunk_tokens: int, group, need: tuple[bool, ...],
                  fuse_wgrad: bool):
    """The loss, per-token losses and accuracy, and the loss's gradients in (hidden, weight, bias) where `need`
    asks for them (None elsewhere), one chunk at a time."""
    need_hidden, need_weight, need_bias = need
    rank, world = _tp_info(group)
    shard = weight.shape[0]
    start = rank * shard
    n = hidden.shape[0]
    losses = torch.empty(n, dtype=torch.float32, device=hidden.device)
    correct = torch.empty(n, dtype=torch.float32, device=hidden.device)
    if token_weights is not None:
        token_weights = token_weights.to(torch.float32)
    grad_hidden = torch.empty_like(hidden) if need_hidden else None
    # Summed over chunks in fp32 (one rounding to the weight's dtype in the backward, as one big matmul would).
    grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
    grad_bias = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_bias else None
    chunk = _ChunkBuffers(min(chunk_tokens, n), weight)
    for lo in range(0, n, chunk_tokens):
        hi = min(lo + chunk_tokens, n)
        inputs = hidden[lo:hi]
        logits = chunk.logits(inputs, weight)  # [c, v/tp] in the compute dtype, this chunk's buffer
        if bias is not None:
            logits += bias  # as megatron's linear adds it: in the compute dtype
        row_max = logits.max(dim=-1).values.float()
        _all_reduce(row_max, dist.ReduceOp.MAX, group, world)
        shifted = chunk.shifted(logits, row_max)  # fp32: the logits as megatron's loss casts them, minus the max
        local, in_shard = _local_labels(labels[lo:hi], start, shard)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1) * in_shard
        torch.exp(shifted, out=shifted)
        both = torch.stack([picked, shifted.sum(dim=-1)])
        _all_reduce(both, dist.ReduceOp.SUM, group, world)
        picked, total = both[0], both[1]
        losses[lo:hi] = torch.log(total) - picked
        correct[lo:hi] = (picked >= 0).float()
        if not any(need):
            continue
        # d(weight × loss) / d logits = weight × (softmax - one-hot) = (exp - total × one-hot) × weight / total:
        # the one-hot taken off the exponentials first, so that one scaling pass writes the gradient in the
        # compute dtype (megatron's fused loss makes the same single bf16 write).
        shifted[torch.arange(hi - lo, device=shifted.device), local] -= total * in_shard
        scale = 1 / total if token_weights is None else token_weights[lo:hi] / total
        grad = chunk.scaled(shifted, scale)
        if need_hidden:
            torch.mm(grad, weight, out=grad_hidden[lo:hi])
        if need_weight:  # fp32-accumulating GEMM into the sum: no [v, h] product per chunk (wgrad_gemm.py)
            accumulate_wgrad(inputs, grad, grad_weight, fused=fuse_wgrad, scratch=chunk.float32)
        if need_bias:
            grad_bias += grad.sum(dim=0, dtype=torch.float32)
    loss = losses.sum() if token_weights is None else (losses * token_weights).sum()
    return loss, losses, correct, grad_hidden, grad_weight, grad_bias


def _tp_info(group) -> tuple[int, int]:
    if group is None or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def _all_reduce(tensor: torch.Tensor, op, group, world: int) -> None:
    if world > 1:
        dist.all_reduce(tensor, op=op, group=group)


class _ChunkBuffers:
    """One chunk's buffers, reused by every chunk (a fresh multi-hundred-MB tensor per chunk costs the allocator,
    and on CPU the kernel's page zeroing): the logits and then the gradient in the compute dtype, and the fp32
    shifted exponentials between them (in fp32 training, one buffer for all three, worked in place)."""

    def __init__(self, rows: int, weight: torch.Tensor):
        shape = (max(rows, 1), weight.shape[0])
        self.float32 = torch.empty(shape, dtype=torch.float32, device=weight.device)
        self.compute = (None if weight.dtype == torch.float32
                        else torch.empty(shape, dtype=weight.dtype, device=weight.device))

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rows = hidden.shape[0]
        out = self.float32 if self.compute is None else self.compute
        return torch.mm(hidden, weight.t(), out=out[:rows])

    def shifted(self, logits: torch.Tensor, row_max: torch.Tensor) -> torch.Tensor:
        """logits - row max in fp32: one pass reading the compute dtype and writing fp32 (in place in fp32)."""
        if self.compute is None:
            return logits.sub_(row_max.unsqueeze(-1))
        return torch.sub(logits, row_max.unsqueeze(-1), out=self.float32[:logits.shape[0]])

    def scaled(self, values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """values × scale per row, written in the compute dtype (in place in fp32)."""
        if self.compute is None:
            return values.mul_(scale.unsqueeze(-1))
        return torch.mul(values, scale.unsqueeze(-1), out=self.compute[:values.shape[0]])


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
    loss_mask: torch.Tensor | None = None  # [b, s], every position's head: each position's weight in the loss
    correct: torch.Tensor | None = None


def chunked_head_loss(*, hidden_states, output_layer, output_weight, labels, context: ChunkedHead, config,
                      **_unused):
    """`GPTModel` output processor: the micro-batch's summed loss, 0-dim fp32 — Σ loss_mask × per-token loss over
    every position, or Σ per-token loss at `context.positions` (with `labels` already selected, [1, n], as for
    `sparse_head_loss`). That is the sum the training step's loss function hands megatron's schedule, which
    divides it by the token count and calls backward on it, so its gradient is exact. The count of correct
    predictions (at the loss mask's positions; every selected position counts) is left in `context.correct`."""
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
    token_weights = None
    if context.positions is not None:
        flat = flat.index_select(0, context.positions)
        targets = labels.reshape(-1)
    else:
        targets = labels.transpose(0, 1).reshape(-1)  # [b, s] -> the sequence-major order of `flat`
        if context.loss_mask is not None:
            token_weights = context.loss_mask.transpose(0, 1).reshape(-1)
    loss, _, correct = chunked_linear_cross_entropy(flat, weight, targets, token_weights, context.chunk_tokens,
                                                    group, fuse_wgrad=fuses_wgrad(output_layer, weight),
                                                    bias=output_layer.bias)
    context.correct = (correct * token_weights).sum() if token_weights is not None else correct.sum()
    return loss
