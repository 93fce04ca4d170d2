"""apex's three softmax extensions, as megatron-core 0.19's `FusedScaleMaskSoftmax` imports them
(`megatron/core/fusions/fused_softmax.py`: `scaled_upper_triang_masked_softmax_cuda`, `scaled_masked_softmax_cuda`,
`scaled_softmax_cuda`), computed with torch on CPU.

Modelled (the kernels' contracts, as in the CUDA sources megatron's and TE's `scaled_*masked_softmax.cu` share):
- fp16/bf16 inputs only (the kernels dispatch on half types; anything else raises);
- the upper-triangular kernel takes [attn_batches, sq, sk] with sq == sk and **no mask argument**: it applies the
  causal triangle and nothing else — whatever mask the caller holds is not seen;
- the masked kernel takes [b, np, sq, sk] and a [b or 1, 1, sq, sk] mask (True = masked), filling masked scores with
  -10000 before the softmax, as megatron's mask_func does;
- `get_batch_per_block(sq, sk, b, np)`: 128 threads per block, warp = min(32, next power of two of sk), two rows per
  warp up to 128 keys — the formula of the real kernel launcher.
Not modelled: speed, the kernels' internal rounding (computed in fp32 here, cast back), the 16 < sk <= 4096 limits
(megatron checks those itself before calling). `calls` counts which kernel ran, so a test can see the fused path
was really taken.
"""
from __future__ import annotations

import contextlib
import sys
import types
from collections import Counter

import torch

MASKED_VALUE = -10000.0
calls: Counter = Counter()


def _half(tensor: torch.Tensor, kernel: str) -> None:
    if tensor.dtype not in (torch.float16, torch.bfloat16):
        raise RuntimeError(f"{kernel}: expected fp16 or bf16 input, got {tensor.dtype}")


def _softmax(scores: torch.Tensor, scale: float, masked: torch.Tensor | None, out_dtype) -> torch.Tensor:
    scores = scores.float() * float(scale)
    if masked is not None:
        scores = scores.masked_fill(masked, MASKED_VALUE)
    return torch.softmax(scores, dim=-1).to(out_dtype)


def _softmax_backward(grads: torch.Tensor, probs: torch.Tensor, scale: float) -> torch.Tensor:
    g, p = grads.float(), probs.float()
    return (float(scale) * p * (g - (g * p).sum(-1, keepdim=True))).to(grads.dtype)


def _upper_triang_forward(inputs: torch.Tensor, scale) -> torch.Tensor:
    _half(inputs, "scaled_upper_triang_masked_softmax")
    if inputs.dim() != 3 or inputs.shape[1] != inputs.shape[2]:
        raise RuntimeError(f"scaled_upper_triang_masked_softmax: expected [batches, sq, sq], got {tuple(inputs.shape)}")
    calls["upper_triang"] += 1
    future = torch.ones(inputs.shape[1:], dtype=torch.bool).triu(1)
    return _softmax(inputs, scale, future, inputs.dtype)


def _masked_forward(inputs: torch.Tensor, mask: torch.Tensor, scale) -> torch.Tensor:
    _half(inputs, "scaled_masked_softmax")
    if inputs.dim() != 4 or mask.dim() != 4:
        raise RuntimeError("scaled_masked_softmax: expected 4-D input and mask")
    calls["masked"] += 1
    return _softmax(inputs, scale, mask.bool(), inputs.dtype)


def _plain_forward(inputs: torch.Tensor, scale) -> torch.Tensor:
    _half(inputs, "scaled_softmax")
    calls["plain"] += 1
    return _softmax(inputs, scale, None, inputs.dtype)


def get_batch_per_block(sq: int, sk: int, b: int, np: int) -> int:
    next_power_of_two = 1 << max(0, (int(sk) - 1).bit_length())
    warp_size = min(next_power_of_two, 32)
    batches_per_warp = 2 if next_power_of_two <= 128 else 1
    return (128 // warp_size) * batches_per_warp


def _module(name: str, **functions) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(functions)
    module.__file__ = __file__
    return module


MODULES = {
    "scaled_upper_triang_masked_softmax_cuda": _module(
        "scaled_upper_triang_masked_softmax_cuda", forward=_upper_triang_forward, backward=_softmax_backward),
    "scaled_masked_softmax_cuda": _module(
        "scaled_masked_softmax_cuda", forward=_masked_forward, backward=_softmax_backward,
        get_batch_per_block=get_batch_per_block),
    "scaled_softmax_cuda": _module("scaled_softmax_cuda", forward=_plain_forward, backward=_softmax_backward),
}


@contextlib.contextmanager
def installed():
    """The three modules importable for the duration (restored afterwards, whatever was there)."""
    saved = {name: sys.modules.get(name) for name in MODULES}
    sys.modules.update(MODULES)
    calls.clear()
    try:
        yield calls
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
