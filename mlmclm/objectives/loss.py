"""The one loss: token cross entropy over vocab-parallel logits, plus token accuracy, summed (not averaged).

Sums let megatron divide by the number of predicted tokens of the *whole* global batch
(`calculate_per_token_loss`), so every data-parallel size and micro-batch split gives the same loss and gradient.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel


@torch.no_grad()
def _correct_predictions(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """1 where the label has the highest logit over the whole (TP-split) vocabulary, else 0."""
    group = parallel_state.get_tensor_model_parallel_group()
    shard_size = logits.shape[-1]
    start = parallel_state.get_tensor_model_parallel_rank() * shard_size
    global_max = logits.max(dim=-1).values
    local = labels - start
    in_shard = (local >= 0) & (local < shard_size)
    label_logit = torch.gather(logits, -1, local.clamp(0, shard_size - 1).unsqueeze(-1)).squeeze(-1)
    label_logit = torch.where(in_shard, label_logit, torch.zeros_like(label_logit))
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
        dist.all_reduce(label_logit, op=dist.ReduceOp.SUM, group=group)
    return (label_logit >= global_max).float()


def token_loss(logits: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor):
    """(summed loss, number of predicted tokens, number correct) for logits [b, s, v/tp] and labels [b, s].

    `logits` is consumed: it is modified in place."""
    logits = logits.float()
    targets = labels.clamp(min=0)  # ignore-index positions carry loss_mask 0
    # Accuracy first: megatron's CE subtracts the row max from `logits` in place (as megatron's own loss path
    # does; the output layer's backward does not need its output, so no copy is made).
    correct = (_correct_predictions(logits, targets) * loss_mask).sum()
    losses = tensor_parallel.vocab_parallel_cross_entropy(logits, targets)
    return (losses * loss_mask).sum(), loss_mask.sum(), correct
