"""The one loss: token cross entropy over vocab-parallel logits, plus token accuracy, summed (not averaged).

Sums let megatron divide by the number of predicted tokens of the *whole* global batch
(`calculate_per_token_loss`), so every data-parallel size and micro-batch split gives the same loss and gradient.
The cross entropy itself is megatron's (`GPTModel` with labels: vocab-parallel, on the [s, b, v] logits, so no
batch-first copy of the logits is made); accuracy is counted from the same logits as they leave the output layer.
For MLM the output layer runs at the masked positions only (`mlmclm.model.sparse_head`): the logits are then
[n, 1, v/tp] and the labels [1, n], and everything here works on them unchanged.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state


@torch.no_grad()
def correct_predictions(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """1 where the label has the highest logit over the whole (TP-split) vocabulary, else 0.

    `logits` [..., v/tp] is this rank's vocabulary shard; `labels` [...] are global token ids.
    """
    group = parallel_state.get_tensor_model_parallel_group()
    shard_size = logits.shape[-1]
    start = parallel_state.get_tensor_model_parallel_rank() * shard_size
    global_max = logits.max(dim=-1).values.float()
    local = labels - start
    in_shard = (local >= 0) & (local < shard_size)
    label_logit = torch.gather(logits, -1, local.clamp(0, shard_size - 1).unsqueeze(-1)).squeeze(-1).float()
    label_logit = torch.where(in_shard, label_logit, torch.zeros_like(label_logit))
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
        dist.all_reduce(label_logit, op=dist.ReduceOp.SUM, group=group)
    return (label_logit >= global_max).float()


class AccuracyTap:
    """A forward hook on the output layer: counts correct predictions of the current micro-batch from the
    [s, b, v/tp] logits before megatron's cross entropy consumes them (in place)."""

    def __init__(self):
        self.labels: torch.Tensor | None = None  # [b, s], set before each forward
        self.loss_mask: torch.Tensor | None = None
        self.correct: torch.Tensor | None = None

    def __call__(self, module, inputs, output):
        logits = output[0] if isinstance(output, tuple) else output
        labels = self.labels.clamp(min=0).transpose(0, 1)
        mask = self.loss_mask.transpose(0, 1)
        self.correct = (correct_predictions(logits, labels) * mask).sum()

    def take(self) -> torch.Tensor | None:
        value, self.correct = self.correct, None
        return value
