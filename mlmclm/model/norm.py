"""Norms usable under sequence parallelism with megatron's local layers: RMSNorm (EuroBERT), LayerNorm without bias
(ModernBERT)."""
from __future__ import annotations

import torch
from megatron.core.transformer.transformer_config import TransformerConfig

from mlmclm.parallel.runtime import current_device


class _Norm(torch.nn.Module):
    """A norm's weight (ones), built from the arguments `build_module` hands any norm of a megatron spec.

    megatron's torch-norm wrapper refuses sequence parallelism; ours mark their weight with `sequence_parallel` (as
    Transformer Engine's norms do) so megatron all-reduces its gradient across TP ranks, each of which saw only a
    slice of the sequence."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype, device=current_device()))
        setattr(self.weight, "sequence_parallel", config.sequence_parallel)


class RMSNorm(_Norm):
    """y = w · x / sqrt(mean(x²) + eps), computed in fp32 like Hugging Face's EuroBERT."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        x = hidden_states.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class LayerNorm(_Norm):
    """LayerNorm without a bias (ModernBERT's: `nn.LayerNorm(..., bias=False)`), computed in fp32: a layer's norm,
    the embedding norm and the head's norm."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        dtype = hidden_states.dtype
        out = torch.nn.functional.layer_norm(hidden_states.float(), (hidden_states.shape[-1],), self.weight.float(),
                                             None, self.eps)
        return out.to(dtype)
