"""apex's `fused_weight_gradient_mlp_cuda`, the kernel behind megatron-core's `gradient_accumulation_fusion`
(`megatron/core/tensor_parallel/layers.py` imports it at module import and calls it from
`LinearWithGradAccumulationAndAsyncCommunication.backward`), computed with torch on CPU.

Modelled (apex `csrc/megatron/fused_weight_gradient_dense.cpp` and `fused_weight_gradient_dense_cuda.cu`):
- `wgrad_gemm_accum_fp32(input, d_output, d_weight)`: d_weight [out, in] **fp32** += d_output [n, out]ᵀ @ input
  [n, in], one cuBLAS GemmEx with fp32 compute and beta = 1 — operands of one dtype (fp32, fp16 or bf16: the
  kernel dispatches on the input's type and reads d_output as the same), inputs with more than two dimensions
  collapsed to [-1, last] (a view: they must be contiguous, as the kernel reads raw pointers with the leading
  dimensions of contiguous row-major storage);
- `wgrad_gemm_accum_fp16`: the same into an fp16/bf16 `d_weight` (the operands' dtype).
Not modelled: speed (its temporaries here are hidden from dispatch modes, as one kernel's would be), cuBLAS's own summation order (fp32 here: products of bf16 values are exact in fp32, the sums
round as any fp32 GEMM). `calls` counts the calls, so a test can see the fused path was taken.

`installed()` makes megatron's layers see the kernel for the duration of a test (as an NGC image's apex would):
the module in `sys.modules`, and megatron's `layers` module's reference and availability flag, restored after;
`install()` does the same for good, in a spawned rank.
"""
from __future__ import annotations

import contextlib
import sys
import types
from collections import Counter

import torch
from torch.utils._python_dispatch import _disable_current_modes

calls: Counter = Counter()
_OPERANDS = (torch.float32, torch.float16, torch.bfloat16)


def _as_2d(tensor: torch.Tensor, name: str) -> torch.Tensor:
    if not tensor.is_contiguous():
        raise RuntimeError(f"fused_weight_gradient_mlp_cuda: {name} must be contiguous (the kernel reads raw "
                           f"pointers)")
    return tensor.view(-1, tensor.shape[-1]) if tensor.dim() > 2 else tensor


def _accumulate(input: torch.Tensor, d_output: torch.Tensor, d_weight: torch.Tensor, kernel: str) -> None:
    if input.dtype not in _OPERANDS or d_output.dtype != input.dtype:
        raise RuntimeError(f"{kernel}: input and d_output must share one of {_OPERANDS}, got {input.dtype} and "
                           f"{d_output.dtype}")
    x, dy = _as_2d(input, "input"), _as_2d(d_output, "d_output")
    if not d_weight.is_contiguous() or d_weight.shape != (dy.shape[1], x.shape[1]) or x.shape[0] != dy.shape[0]:
        raise RuntimeError(f"{kernel}: shapes input {tuple(x.shape)}, d_output {tuple(dy.shape)}, d_weight "
                           f"{tuple(d_weight.shape)} do not make d_weight += d_outputᵀ @ input")
    with _disable_current_modes():  # one opaque kernel on a GPU: its temporaries are not the caller's
        d_weight.add_((dy.float().t() @ x.float()).to(d_weight.dtype))
    calls[kernel] += 1


def wgrad_gemm_accum_fp32(input: torch.Tensor, d_output: torch.Tensor, d_weight: torch.Tensor) -> None:
    if d_weight.dtype != torch.float32:
        raise RuntimeError(f"wgrad_gemm_accum_fp32: d_weight must be fp32, got {d_weight.dtype}")
    _accumulate(input, d_output, d_weight, "wgrad_gemm_accum_fp32")


def wgrad_gemm_accum_fp16(input: torch.Tensor, d_output: torch.Tensor, d_weight: torch.Tensor) -> None:
    if d_weight.dtype not in (torch.float16, torch.bfloat16) or d_weight.dtype != input.dtype:
        raise RuntimeError(f"wgrad_gemm_accum_fp16: d_weight must be the operands' half type, got {d_weight.dtype}")
    _accumulate(input, d_output, d_weight, "wgrad_gemm_accum_fp16")


MODULE = types.ModuleType("fused_weight_gradient_mlp_cuda")
MODULE.wgrad_gemm_accum_fp32 = wgrad_gemm_accum_fp32
MODULE.wgrad_gemm_accum_fp16 = wgrad_gemm_accum_fp16


def install() -> None:
    from megatron.core.tensor_parallel import layers

    sys.modules[MODULE.__name__] = MODULE
    layers.fused_weight_gradient_mlp_cuda = MODULE
    layers._grad_accum_fusion_available = True


@contextlib.contextmanager
def installed():
    from megatron.core.tensor_parallel import layers

    saved_module = sys.modules.get(MODULE.__name__)
    saved = {name: getattr(layers, name, None) for name in ("fused_weight_gradient_mlp_cuda",
                                                              "_grad_accum_fusion_available")}
    install()
    calls.clear()
    try:
        yield calls
    finally:
        if saved_module is None:
            sys.modules.pop(MODULE.__name__, None)
        else:
            sys.modules[MODULE.__name__] = saved_module
        for name, value in saved.items():
            if value is None:
                if hasattr(layers, name):
                    delattr(layers, name)
            else:
                setattr(layers, name, value)
