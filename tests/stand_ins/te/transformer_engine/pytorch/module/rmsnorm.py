"""TE's `RMSNorm` and `LayerNorm` modules (`transformer_engine/pytorch/module/rmsnorm.py`, `layernorm.py`, TE 2.20:
thin wrappers over the fusible operations `ops.RMSNorm` / `ops.LayerNorm`), computed with torch. megatron's `TENorm`
builds one of them (the TE spec's final norm).

Modelled: `normalized_shape` (int or shape; the deprecated `hidden_size` and `params_dtype` spellings, and
both-given refused as TE refuses them), `eps`, `zero_centered_gamma` (weight initialised to 0, applied as 1 + w),
`weight` (and `bias` for LayerNorm) with `dtype`/`device`, the legacy `sequence_parallel` flag set as an attribute of
the parameters (megatron all-reduces such gradients over the TP group), the input's trailing dimensions checked
against the weight's (TE's error), fp32 statistics with the result in the input's dtype, and an `_extra_state`
entry (empty: no FP8). Not modelled: the fused kernels, `sm_margin`, FP8 casts of the output.
"""
from __future__ import annotations

import torch

from transformer_engine.pytorch.module._norm import normalize
from transformer_engine.pytorch.module.base import FP8ExtraState


class _Norm(FP8ExtraState, torch.nn.Module):
    normalization = "RMSNorm"

    def __init__(self, normalized_shape=None, eps: float = 1e-5, sequence_parallel=None, params_dtype=None,
                 zero_centered_gamma: bool = False, hidden_size=None, device="cuda", dtype=None,
                 sm_margin=0) -> None:
        super().__init__()
        if normalized_shape is None:
            if hidden_size is None:
                raise RuntimeError("Neither `normalized_shape` nor `hidden_size` (deprecated) args are provided")
            normalized_shape = hidden_size
        elif hidden_size is not None:
            raise RuntimeError("Both `normalized_shape` and `hidden_size` (deprecated) args are provided")
        if params_dtype is not None:
            if dtype is not None:
                raise RuntimeError("Both `dtype` and `params_dtype` (deprecated) kwargs are provided")
            dtype = params_dtype
        if sm_margin:
            raise NotImplementedError("the TE norm stand-in models no sm_margin")
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        dtype = torch.get_default_dtype() if dtype is None else dtype
        self.eps, self.zero_centered_gamma, self.sequence_parallel = eps, zero_centered_gamma, sequence_parallel
        self.fp8_meta = {"fp8_checkpoint": False}
        self.weight = torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        if self.normalization == "LayerNorm":
            self.bias = torch.nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
        else:
            self.bias = None
        if str(device) != "meta":
            self.reset_parameters()

    def reset_parameters(self, defer_init=None) -> None:
        if defer_init:
            return
        with torch.no_grad():
            self.weight.fill_(0.0 if self.zero_centered_gamma else 1.0)
            if self.bias is not None:
                self.bias.zero_()
        if self.sequence_parallel is not None:
            self.weight.sequence_parallel = self.sequence_parallel
            if self.bias is not None:
                self.bias.sequence_parallel = self.sequence_parallel

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return normalize(inp, self.weight, self.bias, self.eps, self.normalization, self.zero_centered_gamma)


class RMSNorm(_Norm):
    normalization = "RMSNorm"


class LayerNorm(_Norm):
    normalization = "LayerNorm"
