"""The chunked head's weight-gradient GEMM: `out` [v, h] fp32 += grad [c, v]ᵀ @ inputs [c, h], one chunk at a time,
accumulating in fp32 from operands in the compute dtype — never a [v, h] product in bf16 and its fp32 copy per chunk
(issue 55: at 128k vocabulary those copies made the head memory-bound, ~3x megatron's whole head on an H100).

The GEMM each path runs, the first that applies:
- "fp32 addmm": fp32 operands (fp32 training, the CPU tests): torch's in-place addmm into the sum.
- "apex wgrad_gemm_accum_fp32": under megatron's gradient-accumulation fusion (mlmclm.model.wgrad_fusion): the
  kernel megatron's own linear layers call for this (`fused_weight_gradient_mlp_cuda`).
- "TE general_gemm": Transformer Engine importable: its GEMM with `out_dtype=float32, accumulate=True` into the
  sum, as TE's `Linear` does for its own weight gradient into `main_grad` (`module/linear.py`).
- "torch addmm out_dtype": CUDA, and a torch whose addmm takes `out_dtype` (`aten::addmm.dtype_out`); tried once,
  and left for the next path if this torch's CUDA kernel refuses an fp32 accumulator next to bf16 operands.
- "fp32 upcast addmm": anywhere else (bf16 on CPU): the chunk's operands copied to fp32 (into the caller's chunk-
  sized scratch: [c, v], never [v, h]) and an fp32 addmm.

`last_path` records what the last chunk ran: the GPU session reports it next to its speed rows, so a row says which
GEMM training took rather than which one was hoped for.
"""
from __future__ import annotations

import torch

FP32, APEX, TE, TORCH, UPCAST = ("fp32 addmm", "apex wgrad_gemm_accum_fp32", "TE general_gemm",
                                 "torch addmm out_dtype", "fp32 upcast addmm")
last_path: str | None = None
_torch_dtype_addmm: bool | None = None  # None: not tried yet on this process's CUDA


def choose_path(dtype: torch.dtype, cuda: bool, fused: bool) -> str:
    """The GEMM for operands of `dtype` on CUDA or not, under megatron's fusion or not (first that applies)."""
    if fused:
        return APEX
    if dtype == torch.float32:
        return FP32
    if cuda and te_general_gemm() is not None:
        return TE
    if cuda and _torch_dtype_addmm is not False and hasattr(torch.ops.aten.addmm, "dtype_out"):
        return TORCH
    return UPCAST


def accumulate_wgrad(inputs: torch.Tensor, grad: torch.Tensor, out: torch.Tensor, fused: bool = False,
                     scratch: torch.Tensor | None = None) -> str:
    """out [v, h] fp32 += grad [c, v]ᵀ @ inputs [c, h]; returns the path taken. `scratch`: an fp32 buffer of at
    least grad's size, for the upcast path (else it allocates one)."""
    global last_path
    path = choose_path(inputs.dtype, inputs.is_cuda, fused)
    if path == TORCH and not _try_torch_dtype_addmm(inputs, grad, out):
        path = UPCAST
    if path != TORCH:
        KERNELS[path](inputs, grad, out, scratch)
    last_path = path
    return path


def _fp32(inputs, grad, out, _scratch) -> None:
    out.addmm_(grad.t(), inputs)


def _apex(inputs, grad, out, _scratch) -> None:
    from megatron.core.tensor_parallel import layers

    layers.fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32(inputs.contiguous(), grad.contiguous(), out)


def te_general_gemm():
    """TE's `general_gemm` (TE >= 2.0), or None where TE does not import."""
    try:
        from transformer_engine.pytorch.cpp_extensions import general_gemm
    except Exception:  # not installed, or a build that does not load: the next path
        return None
    return general_gemm


def _te(inputs, grad, out, _scratch) -> None:
    # TE's layouts read cuBLAS's column-major operands: "NT" with (A = input [c, h], B = grad [c, v]) makes
    # [v, h] = Bᵀ @ A, the weight gradient, as TE's Linear calls it for its own.
    kwargs = {}
    try:
        from transformer_engine.pytorch.module.base import get_workspace

        kwargs["workspace"] = get_workspace()
    except ImportError:
        pass
    te_general_gemm()(inputs.contiguous(), grad.contiguous(), out_dtype=torch.float32, accumulate=True,
                      layout="NT", out=out, grad=True, **kwargs)


def _try_torch_dtype_addmm(inputs, grad, out) -> bool:
    global _torch_dtype_addmm
    try:
        torch.addmm(out, grad.t(), inputs, out_dtype=torch.float32, out=out)
    except (RuntimeError, TypeError, NotImplementedError) as err:
        # Some torch versions' CUDA kernel wants the accumulator in the operands' dtype: refused before any work.
        if _torch_dtype_addmm or "dtype" not in str(err):
            raise
        _torch_dtype_addmm = False
        return False
    _torch_dtype_addmm = True
    return True


def _upcast(inputs, grad, out, scratch) -> None:
    rows, cols = grad.shape
    if scratch is None or scratch.numel() < grad.numel():
        scratch = torch.empty(grad.shape, dtype=torch.float32, device=grad.device)
    wide = scratch.view(-1)[:rows * cols].view(rows, cols)
    wide.copy_(grad)  # bf16 values are exact in fp32: the same operands an fp32-accumulating GEMM reads
    out.addmm_(wide.t(), inputs.float())


KERNELS = {FP32: _fp32, APEX: _apex, TE: _te, UPCAST: _upcast}
