"""TE's LayerNorm / RMSNorm arithmetic (`module/_common.py::apply_normalization` and the ops' `op_forward`, TE 2.20):
statistics and the affine transform in fp32, the result in the input's dtype; `zero_centered_gamma` scales by
(1 + gamma). Not modelled: the cuDNN/TE kernels and their rounding, `sm_margin`."""
from __future__ import annotations

import torch

NORMALIZATIONS = ("LayerNorm", "RMSNorm")


def normalize(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float, normalization: str,
              zero_centered_gamma: bool) -> torch.Tensor:
    assert normalization in NORMALIZATIONS, "Unsupported normalization type!"
    dims = weight.dim()
    if tuple(x.shape[-dims:]) != tuple(weight.shape):
        raise ValueError(f"Input tensor (shape={tuple(x.shape)}) and weight tensor (shape={tuple(weight.shape)}) "
                         "are not compatible")
    reduce = tuple(range(-dims, 0))
    x32 = x.float()
    if normalization == "LayerNorm":
        x32 = x32 - x32.mean(dim=reduce, keepdim=True)
        y = x32 * torch.rsqrt(x32.pow(2).mean(dim=reduce, keepdim=True) + eps)
    else:
        y = x32 * torch.rsqrt(x32.pow(2).mean(dim=reduce, keepdim=True) + eps)
    gamma = weight.float() + 1 if zero_centered_gamma else weight.float()
    y = y * gamma
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
