"""What an objective hands the training step: the batch (model inputs, labels, loss mask) and the objective's
interface. Its own module so that the objectives (clm.py, mlm.py) and the package that builds them do not import
each other."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import torch

from mlmclm.parallel.runtime import to_device

IGNORE_INDEX = -100


@dataclass
class ObjectiveBatch:
    input_ids: torch.Tensor      # LongTensor [b, S]
    labels: torch.Tensor         # LongTensor [b, S], IGNORE_INDEX where nothing is predicted
    loss_mask: torch.Tensor      # FloatTensor [b, S], 1 where a label is predicted
    causal: bool                 # attention type the objective needs
    num_predicted: torch.Tensor  # 0-dim int64 on the batch's device: predicted tokens, for logging (no sync)
    num_maskable: torch.Tensor | None = None  # MLM: tokens that could be masked (the realised rate's denominator)

    def to(self, device: torch.device) -> ObjectiveBatch:
        """The batch on `device`. From the host to a GPU the tensors are pinned first, so that the copies are
        queued without the host waiting for the device."""
        return replace(self, input_ids=to_device(self.input_ids, device), labels=to_device(self.labels, device),
                       loss_mask=to_device(self.loss_mask, device),
                       num_predicted=to_device(self.num_predicted, device),
                       num_maskable=None if self.num_maskable is None else to_device(self.num_maskable, device))


class Objective(Protocol):
    name: str
    causal: bool

    def prepare(self, tokens: torch.Tensor, sample_ids: torch.Tensor,
                positions: torch.Tensor | None = None) -> ObjectiveBatch: ...
