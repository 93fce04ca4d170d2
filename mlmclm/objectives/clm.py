"""Causal LM: predict token i+1 from tokens <= i, keeping the sequence length S (megatron needs a fixed S)."""
from __future__ import annotations

import torch

from mlmclm.objectives import IGNORE_INDEX, ObjectiveBatch


class CausalLM:
    name = "clm"
    causal = True

    def __init__(self, no_label_ids: list[int]):
        # Token ids never used as labels: at least the pad id (see build_objective).
        self._no_label_ids = sorted(set(no_label_ids))

    def prepare(self, tokens: torch.Tensor, sample_ids: torch.Tensor) -> ObjectiveBatch:
        labels = torch.full_like(tokens, IGNORE_INDEX)
        labels[:, :-1] = tokens[:, 1:]
        if self._no_label_ids:
            excluded = torch.tensor(self._no_label_ids, dtype=tokens.dtype, device=tokens.device)
            labels[torch.isin(labels, excluded)] = IGNORE_INDEX
        predicted = labels != IGNORE_INDEX
        return ObjectiveBatch(tokens, labels, predicted.float(), causal=True, num_predicted=predicted.sum())
