"""`transformer_engine.pytorch.cpp_extensions` of the stand-in: `general_gemm`, TE's one GEMM entry point (TE >= 2.0,
read at `pytorch/cpp_extensions/gemm.py` of 2.2 and the 2.20 development head, and its use for the weight gradient in
`module/linear.py`), computed with torch on CPU.

Modelled: the operands (A, B) and the layout — cuBLAS's column-major view, which row-major reads as "TN": B @ Aᵀ
(the forward: A the weight, B the input), "NN": B @ A (the input gradient), "NT": Bᵀ @ A (the weight gradient: A
the input, B the output gradient); any other layout is refused; `out` must be contiguous (TE's ValueError);
`accumulate=True` adds into `out` (cuBLAS's beta = 1) and needs it; `out_dtype` is the output's dtype and must be
`out`'s when both are given; the operands share one high-precision dtype (fp32, bf16, fp16) and are summed in fp32
(products of bf16 values are exact in fp32). Returns (out, bias_grad, gelu_input, extra_output) as TE 2.x does.
Not modelled: FP8 operands and quantizers, bias and GELU epilogues, userbuffers overlap, cuBLAS's summation order.
`calls` counts the calls by layout, so a test sees the path was taken.
"""
from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import _disable_current_modes

calls: Counter = Counter()
_OPERANDS = (torch.float32, torch.bfloat16, torch.float16)


def general_gemm(A, B, workspace=None, out_dtype=None, quantization_params=None, gelu=False, gelu_in=None,
                 accumulate=False, layout="TN", out=None, bias=None, use_split_accumulator=False, grad=False,
                 ub=None, ub_type=None, extra_output=None, bulk_overlap=False):
    if layout not in ("TN", "NN", "NT"):
        raise AssertionError(f"GEMM layout {layout} not supported.")
    if out is not None and not out.is_contiguous():
        raise ValueError("Output tensor is not contiguous.")
    if A.dtype not in _OPERANDS or B.dtype != A.dtype:
        raise RuntimeError(f"general_gemm (stand-in): operands must share one of {_OPERANDS}, got {A.dtype}, {B.dtype}")
    if quantization_params is not None or gelu or bias is not None or ub is not None:
        raise NotImplementedError("general_gemm (stand-in): FP8, epilogues and overlap are not modelled")
    if accumulate and out is None:
        raise RuntimeError("general_gemm (stand-in): accumulate=True needs `out`")
    dtype = out_dtype if out_dtype is not None else (out.dtype if out is not None else A.dtype)
    if out is not None and out.dtype != dtype:
        raise RuntimeError(f"general_gemm (stand-in): out is {out.dtype}, out_dtype {dtype}")
    with _disable_current_modes():  # one opaque kernel on a GPU: its temporaries are not the caller's
        a, b = A.float(), B.float()
        product = {"TN": lambda: b @ a.t(), "NN": lambda: b @ a, "NT": lambda: b.t() @ a}[layout]()
        if out is None:
            out = product.to(dtype)
        elif accumulate:
            out.add_(product.to(dtype))
        else:
            out.copy_(product)
    calls[layout] += 1
    return out, None, None, None
