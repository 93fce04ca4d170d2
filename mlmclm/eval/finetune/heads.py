"""Small heads over `AutoModel` for what transformers' EuroBERT lacks: a QA span head and a mean-pooled bi-encoder."""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoModel

from mlmclm.eval.finetune.loading import load_options


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


class SpanQAModel(nn.Module):
    """Encoder + linear start/end scorer (SQuAD-style); position 0 stands for 'no answer'."""

    def __init__(self, model_dir: Path):
        super().__init__()
        self.encoder = AutoModel.from_pretrained(model_dir, trust_remote_code=False, **load_options())
        self.span = nn.Linear(self.encoder.config.hidden_size, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        start, end = self.span(hidden).unbind(dim=-1)
        very_negative = torch.finfo(start.dtype).min
        return start.masked_fill(attention_mask == 0, very_negative), end.masked_fill(attention_mask == 0, very_negative)


class MeanPoolingEncoder(nn.Module):
    """Bi-encoder tower: mean of the last hidden states over real tokens, L2-normalised."""

    def __init__(self, model_dir: Path):
        super().__init__()
        self.encoder = AutoModel.from_pretrained(model_dir, trust_remote_code=False, **load_options())

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return nn.functional.normalize(mean_pool(hidden, attention_mask), dim=-1)


def info_nce_loss(queries: torch.Tensor, passages: torch.Tensor, temperature: float) -> torch.Tensor:
    """Contrastive loss with in-batch negatives: passage i is the positive of query i, all others negatives."""
    logits = queries @ passages.T / temperature
    return nn.functional.cross_entropy(logits, torch.arange(len(queries), device=logits.device))
