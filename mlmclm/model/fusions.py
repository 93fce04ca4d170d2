"""Which of megatron-core's fused kernels to switch on: each only where its kernel can be imported for the spec in use.

megatron reads each `TransformerConfig` flag in one place and imports its kernel there, at the first forward or
backward — so a flag set without its kernel crashes mid-run. What each flag needs (megatron-core 0.19):

| flag | read by | needs |
|---|---|---|
| masked_softmax_fusion | `FusedScaleMaskSoftmax` of megatron's *local* attention (TE attention ignores it) | apex's `scaled_masked_softmax_cuda`, `scaled_upper_triang_masked_softmax_cuda` (causal), `scaled_softmax_cuda` (no mask) |
| gradient_accumulation_fusion | `ColumnParallelLinear` (refuses at construction without the kernel) / `RowParallelLinear`; TE linears use TE's own | apex's `fused_weight_gradient_mlp_cuda` in either spec: the LM head is always megatron's `ColumnParallelLinear` |
| bias_activation_fusion, bias_dropout_fusion, cross_entropy_loss_fusion ("native") | `megatron.core.fusions.*`, decorated with `megatron.core.jit.jit_fuser` = `torch.compile` | Inductor on CUDA: triton, and a C compiler for triton's launcher |
| apply_rope_fusion | `rope_utils.apply_rotary_pos_emb` | TE's fused RoPE (`megatron.core.extensions.transformer_engine.fused_apply_rotary_pos_emb`) |
| persist_layer_norm | megatron's apex `FusedLayerNorm` only (a LayerNorm); megatron's torch norm asserts it is off | nothing here reads it: our norms are RMSNorm (ours or TE's) — always off |

`decide_fusions` is pure (availability in, flags and reasons out) so it is tested on CPU; `probe_kernels` does the
real import checks. The TE cross-entropy variant is not used: megatron warns it has known stability issues.
"""
from __future__ import annotations

import importlib
import logging
import os
import shutil
from dataclasses import dataclass, fields

log = logging.getLogger(__name__)

APEX_SOFTMAX_MODULES = ("scaled_masked_softmax_cuda", "scaled_upper_triang_masked_softmax_cuda", "scaled_softmax_cuda")
APEX_WGRAD_MODULE = "fused_weight_gradient_mlp_cuda"


@dataclass(frozen=True)
class KernelAvailability:
    """What can run here. Each field is None when available, else the reason it is not."""

    gpu: str | None
    apex_softmax: str | None
    apex_wgrad: str | None
    jit_fuser: str | None
    te_rope: str | None


@dataclass(frozen=True)
class Fusion:
    on: bool
    reason: str  # why on, or what is missing


@dataclass(frozen=True)
class FusionFlags:
    masked_softmax_fusion: Fusion
    gradient_accumulation_fusion: Fusion
    bias_activation_fusion: Fusion
    bias_dropout_fusion: Fusion
    cross_entropy_loss_fusion: Fusion
    apply_rope_fusion: Fusion
    persist_layer_norm: Fusion

    def config_kwargs(self) -> dict:
        """The `TransformerConfig` keyword arguments."""
        kwargs = {f.name: getattr(self, f.name).on for f in fields(self)}
        kwargs["cross_entropy_fusion_impl"] = "native"
        return kwargs

    def summary(self, use_te: bool) -> str:
        """One line: which fusions are on, which are off and why."""
        spec = "transformer_engine" if use_te else "local"
        on = [f.name for f in fields(self) if getattr(self, f.name).on]
        off = [f"{f.name} ({getattr(self, f.name).reason})" for f in fields(self) if not getattr(self, f.name).on]
        return f"fused kernels ({spec} spec): on: {', '.join(on) or 'none'}; off: {'; '.join(off) or 'none'}"


def decide_fusions(avail: KernelAvailability, use_te: bool) -> FusionFlags:
    """Each flag on only when its kernel is available for this spec (see the module's table)."""

    def needs(*missing: str | None, why_on: str) -> Fusion:
        for reason in (avail.gpu, *missing):
            if reason is not None:
                return Fusion(False, reason)
        return Fusion(True, why_on)

    if use_te:
        softmax = Fusion(False, "not read by TE's attention (it has its own kernels)")
    else:
        softmax = needs(avail.apex_softmax, why_on="apex softmax kernels")
    jit = dict(why_on="torch.compile (megatron jit_fuser)")
    return FusionFlags(
        masked_softmax_fusion=softmax,
        gradient_accumulation_fusion=needs(avail.apex_wgrad, why_on=f"apex {APEX_WGRAD_MODULE}"),
        bias_activation_fusion=needs(avail.jit_fuser, **jit),
        bias_dropout_fusion=needs(avail.jit_fuser, **jit),
        cross_entropy_loss_fusion=needs(avail.jit_fuser, **jit),
        apply_rope_fusion=needs(avail.te_rope, why_on="TE fused RoPE"),
        persist_layer_norm=Fusion(False, "read only by megatron's apex LayerNorm; this model uses RMSNorm"),
    )


def _import_error(*modules: str) -> str | None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as err:  # ImportError, or an extension built for another torch raising at import
            return f"{name} not importable ({type(err).__name__})"
    return None


def _jit_fuser_error() -> str | None:
    try:
        from torch.utils._triton import has_triton
    except ImportError:
        has_triton = None
    if has_triton is not None and not has_triton():
        return "torch.compile on CUDA needs triton (absent or unsupported by this GPU)"
    if has_triton is None and _import_error("triton"):
        return "torch.compile on CUDA needs triton"
    compilers = [os.environ.get("CC"), "cc", "gcc", "clang"]
    if not any(c and shutil.which(c) for c in compilers):
        return "torch.compile on CUDA needs a C compiler for triton (set CC or install gcc)"
    return None


def _te_rope_error() -> str | None:
    try:
        # The THD variant too: packed segments (random-length samples) need it (mlmclm.model.build).
        from megatron.core.extensions.transformer_engine import (  # noqa: F401
            fused_apply_rotary_pos_emb, fused_apply_rotary_pos_emb_thd)
    except Exception as err:
        return f"TE fused RoPE not importable ({type(err).__name__})"
    return None


def probe_kernels() -> KernelAvailability:
    """The real import checks. Without CUDA nothing else is probed: every fused kernel is GPU-only."""
    from mlmclm.parallel.runtime import on_gpu

    if not on_gpu():
        none = "no CUDA device"
        return KernelAvailability(gpu=none, apex_softmax=none, apex_wgrad=none, jit_fuser=none, te_rope=none)
    return KernelAvailability(
        gpu=None,
        apex_softmax=_import_error(*APEX_SOFTMAX_MODULES),
        apex_wgrad=_import_error(APEX_WGRAD_MODULE),
        jit_fuser=_jit_fuser_error(),
        te_rope=_te_rope_error(),
    )


def all_off(reason: str) -> FusionFlags:
    off = Fusion(False, reason)
    return FusionFlags(**{f.name: off for f in fields(FusionFlags)})


def fusion_flags(use_te: bool, avail: KernelAvailability | None = None, enabled: bool = True) -> FusionFlags:
    """Decide the flags for this machine and spec, and log them in one line. `enabled=False`: all off."""
    if not enabled:
        flags = all_off("switched off (fused_kernels=false)")
    else:
        flags = decide_fusions(avail if avail is not None else probe_kernels(), use_te)
    log.info(flags.summary(use_te))
    return flags
