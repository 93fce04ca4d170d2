"""Causal LM: predict token i+1 from tokens <= i, keeping the sequence length S (megatron needs a fixed S)."""
from __future__ import annotations

import torch

from mlmclm.objectives.batch import IGNORE_INDEX, ObjectiveBatch


class CausalLM:
    name = "clm"
    causal = True

    def __init__(self, no_label_ids: list[int]):
        # Token ids never used as labels: at least the pad id (see build_objective).
        self._no_label_ids = sorted(set(no_label_ids))

    def prepare(self, tokens: torch.Tensor, sample_ids: torch.Tensor,
                positions: torch.Tensor | None = None) -> ObjectiveBatch:
        """With per-token `sample_ids` [b, S] (samples laid end to end, -1 on padding), no label crosses a
        sample's end and padding predicts nothing; `positions` are not needed (CLM draws no randoms)."""
        labels = torch.full_like(tokens, IGNORE_INDEX)
        labels[:, :-1] = tokens[:, 1:]
        if sample_ids.dim() == 2:
            same = torch.zeros_like(tokens, dtype=torch.bool)
            same[:, :-1] = (sample_ids[:, 1:] == sample_ids[:, :-1]) & (sample_ids[:, :-1] >= 0)
            labels[~same.to(tokens.device)] = IGNORE_INDEX
        if self._no_label_ids:
            excluded = torch.tensor(self._no_label_ids, dtype=tokens.dtype, device=tokens.device)
            labels[torch.isin(labels, excluded)] = IGNORE_INDEX
        predicted = labels != IGNORE_INDEX
        return ObjectiveBatch(tokens, labels, predicted.float(), causal=True, num_predicted=predicted.sum())
