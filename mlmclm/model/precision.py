"""Numeric precision choices: bf16 on GPU, fp32 on CPU, FP8 through Transformer Engine when asked for."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class PrecisionConfig:
    """`dtype` "auto" means bf16 on GPU and fp32 on CPU (CPU bf16 matmuls are slow and not what tests check)."""

    dtype: Literal["auto", "bf16", "fp32"] = "auto"
    fp8: Literal[None, "hybrid", "e4m3"] = None  # FP8 GEMMs through TE (needs the TE layer spec)
    fp8_recipe: Literal["delayed", "tensorwise", "mxfp8", "blockwise"] = "delayed"
    fp8_attention: Literal["auto", "on", "off"] = "auto"  # FP8 dot-product attention where TE supports it

    def __post_init__(self):
        if self.dtype not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision.dtype must be auto, bf16 or fp32, got {self.dtype!r}")
        if self.fp8 not in (None, "hybrid", "e4m3"):
            raise ValueError(f"precision.fp8 must be null, 'hybrid' or 'e4m3', got {self.fp8!r}")
        if self.fp8_attention not in ("auto", "on", "off"):
            raise ValueError(f"precision.fp8_attention must be auto, on or off, got {self.fp8_attention!r}")

    def resolved_dtype(self, on_gpu: bool) -> str:
        if self.dtype == "auto":
            return "bf16" if on_gpu else "fp32"
        return self.dtype


def transformer_engine_available() -> tuple[bool, str]:
    """Whether TE's layers can be used here, and why not."""
    from mlmclm.parallel.runtime import on_gpu

    if not on_gpu():
        return False, "no CUDA device"
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as err:  # ImportError, or a broken build raising at import
        return False, f"transformer_engine not importable ({type(err).__name__}: {err})"
    return True, "transformer_engine importable and CUDA present"


def fp8_attention_decision(head_dim: int, training: bool = True) -> tuple[bool, str]:
    """Whether FP8 dot-product attention can be used for this shape, with the reason in one line.

    TE's FP8 fused attention on Hopper has required head_dim 128 in training; the paper's shapes use 64 and 96.
    """
    from mlmclm.parallel.runtime import gpu_capability

    ok, why = transformer_engine_available()
    if not ok:
        return False, f"FP8 attention off: {why}"
    major, minor = gpu_capability()
    if major < 9:
        return False, f"FP8 attention off: needs compute capability >= 9.0 (Hopper), this GPU is {major}.{minor}"
    if major == 9 and training and head_dim != 128:
        return False, (f"FP8 attention off: TE's FP8 fused attention on Hopper trains only with head_dim 128, "
                       f"this model has head_dim {head_dim}; attention runs in bf16, GEMMs still in FP8")
    return True, f"FP8 attention on (head_dim {head_dim}, compute capability {major}.{minor})"
