"""Numeric precision choices: bf16 on GPU, fp32 on CPU, FP8 through Transformer Engine when asked for."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise")  # megatron's Fp8Recipe names


@dataclass
class PrecisionConfig:
    """`dtype` "auto" means bf16 on GPU and fp32 on CPU (CPU bf16 matmuls are slow and not what tests check)."""

    dtype: Literal["auto", "bf16", "fp32"] = "auto"
    fp8: Literal[None, "hybrid", "e4m3"] = None  # FP8 GEMMs through TE (needs the TE layer spec)
    # Per-tensor current scaling ("tensorwise"), Megatron-Bridge's `bf16_with_fp8_current_scaling_mixed`: each
    # GEMM input is scaled from its own amax, no history to go stale. (megatron's own default is "delayed"; the one
    # thing delayed scaling adds on Hopper is FP8 attention, which TE trains there only at head_dim 128 — none of
    # the paper's sizes, whose heads are 64 wide.) Changing the recipe of a run is refused on resume.
    fp8_recipe: Literal["delayed", "tensorwise", "mxfp8", "blockwise"] = "tensorwise"
    fp8_attention: Literal["auto", "on", "off"] = "auto"  # FP8 dot-product attention where TE supports it
    # Delayed scaling only: scale from the max amax over the last 1024 steps, as NVIDIA's NeMo 2 / Megatron-Bridge
    # delayed-scaling recipes ship it (megatron's own default, history 1 / most_recent, follows single-step outliers).
    fp8_amax_history_len: int = 1024
    fp8_amax_compute_algo: Literal["max", "most_recent"] = "max"
    # Keep the first / last N transformer layers in bf16 (megatron `first_last_layers_bf16`), the usual guard for
    # the layers most sensitive to FP8 error. Off by default; megatron refuses it with delayed scaling.
    fp8_first_last_layers_bf16: bool = False
    fp8_layers_at_start_in_bf16: int = 1
    fp8_layers_at_end_in_bf16: int = 1
    # Delayed scaling: reduce amaxes over the tensor-parallel group only, not TP×DP (megatron `tp_only_amax_red`),
    # one all-reduce less per forward. DP replicas then scale with their own amaxes: their forwards differ in
    # rounding, their weights stay identical (gradients are still averaged). Off by default (bit-reproducible
    # across data-parallel sizes); has no effect with current scaling, whose amaxes are per tensor and per step.
    fp8_tp_only_amax_reduction: bool = False

    def __post_init__(self):
        if self.dtype not in ("auto", "bf16", "fp32"):
            raise ValueError(f"precision.dtype must be auto, bf16 or fp32, got {self.dtype!r}")
        if self.fp8 not in (None, "hybrid", "e4m3"):
            raise ValueError(f"precision.fp8 must be null, 'hybrid' or 'e4m3', got {self.fp8!r}")
        if self.fp8_recipe not in FP8_RECIPES:
            raise ValueError(f"precision.fp8_recipe must be one of {FP8_RECIPES}, got {self.fp8_recipe!r}")
        if self.fp8_attention not in ("auto", "on", "off"):
            raise ValueError(f"precision.fp8_attention must be auto, on or off, got {self.fp8_attention!r}")
        if int(self.fp8_amax_history_len) < 1:
            raise ValueError(f"precision.fp8_amax_history_len must be >= 1, got {self.fp8_amax_history_len!r}")
        if self.fp8_amax_compute_algo not in ("max", "most_recent"):
            raise ValueError("precision.fp8_amax_compute_algo must be max or most_recent, "
                             f"got {self.fp8_amax_compute_algo!r}")
        if self.fp8 and self.fp8_first_last_layers_bf16 and self.fp8_recipe == "delayed":
            raise ValueError("precision.fp8_first_last_layers_bf16 needs a current-scaling recipe (tensorwise, "
                             "blockwise, mxfp8): megatron does not support bf16 first/last layers with delayed scaling")
        for name in ("fp8_layers_at_start_in_bf16", "fp8_layers_at_end_in_bf16"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"precision.{name} must be >= 0, got {getattr(self, name)!r}")

    def fp8_scaling_kwargs(self) -> dict:
        """megatron `TransformerConfig` fields for FP8 scaling (the amax history matters to delayed scaling)."""
        return {"fp8_amax_history_len": int(self.fp8_amax_history_len),
                "fp8_amax_compute_algo": self.fp8_amax_compute_algo,
                "first_last_layers_bf16": bool(self.fp8 and self.fp8_first_last_layers_bf16),
                "num_layers_at_start_in_bf16": int(self.fp8_layers_at_start_in_bf16),
                "num_layers_at_end_in_bf16": int(self.fp8_layers_at_end_in_bf16),
                "tp_only_amax_red": bool(self.fp8_tp_only_amax_reduction)}

    def resolved_dtype(self, on_gpu: bool) -> str:
        if self.dtype == "auto":
            return "bf16" if on_gpu else "fp32"
        return self.dtype


# megatron-core 0.19 builds the tensorwise (current-scaling) recipe, our default, only on TE >= 2.2
# (`fp8_utils.get_fp8_recipe`: `is_te_min_version("2.2.0.dev0")`; below it the recipe is never built and the first
# FP8 step fails). pyproject's `gpu` extra asks for the same floor; this check catches an image that ships older.
TE_MIN_VERSION = (2, 2)


def te_version_error(version: str) -> str | None:
    """Why this TE version cannot be used (None when it can): below `TE_MIN_VERSION`, or unreadable."""
    from packaging.version import InvalidVersion, Version

    try:
        parsed = Version(version)
    except InvalidVersion:
        return f"transformer_engine reports an unreadable version {version!r}"
    floor = ".".join(map(str, TE_MIN_VERSION))
    if parsed.release[:2] < TE_MIN_VERSION:
        return (f"transformer_engine {version} is older than {floor}: megatron-core builds the tensorwise FP8 recipe "
                f"only on TE >= 2.2; install transformer-engine[pytorch]>={floor}")
    return None


def installed_te_version() -> str:
    """TE's version as megatron reads it (`megatron.core.utils.get_te_version`): `__version__`, else pip's."""
    import transformer_engine

    if hasattr(transformer_engine, "__version__"):
        return str(transformer_engine.__version__)
    from importlib.metadata import version

    return version("transformer-engine")


def transformer_engine_available() -> tuple[bool, str]:
    """Whether TE's layers can be used here, and why not (no GPU, not importable, or older than TE_MIN_VERSION)."""
    from mlmclm.parallel.runtime import on_gpu

    if not on_gpu():
        return False, "no CUDA device"
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as err:  # ImportError, or a broken build raising at import
        return False, f"transformer_engine not importable ({type(err).__name__}: {err})"
    too_old = te_version_error(installed_te_version())
    if too_old:
        return False, too_old
    return True, "transformer_engine importable and CUDA present"


# Per recipe, the oldest TE megatron-core 0.19 builds it with (`fp8_utils.get_fp8_recipe`): delayed and MXFP8 from
# TE 2.1, current scaling from 2.2.0.dev0, block scaling (Float8BlockScaling) from 2.3.0.dev0 — below that the
# recipe is not built and the first forward raises megatron's ValueError.
RECIPE_TE_FLOOR = {"delayed": (2, 1), "mxfp8": (2, 1), "tensorwise": (2, 2), "blockwise": (2, 3)}
# Block scaling's GEMMs need CUDA >= 12.9 (TE's `check_fp8_block_scaling_support`, TE 2.3-2.20); TE 2.3-2.8 run them
# on Hopper only (sm90 <= capability < sm100), TE >= 2.9 on sm90 and newer.
BLOCKWISE_MIN_CUDA = (12, 9)
BLOCKWISE_ANY_ARCH_TE = (2, 9)


def _release(version: str | None) -> tuple[int, ...] | None:
    from packaging.version import InvalidVersion, Version

    try:
        return None if version is None else Version(version).release
    except InvalidVersion:
        return None


def fp8_recipe_error(capability: tuple[int, int] | None, recipe: str, te_version: str | None = None,
                     cuda_version: str | None = None) -> str | None:
    """Why TE cannot run FP8 GEMMs with `recipe` here (None when it can). From TE's support checks
    (`transformer_engine/pytorch/quantization.py`, TE 2.x: `_compute_fp8_support`, `_compute_mxfp8_support`,
    `_compute_fp8_block_scaling_support`; `fp8.py` before 2.9): FP8 needs sm89+; MXFP8 sm100-sm11x (not sm120+);
    block scaling sm90+ (sm90-sm9x only on TE 2.3-2.8) and CUDA >= 12.9. With `te_version` (TE's `__version__`),
    also the recipe's TE floor in megatron (RECIPE_TE_FLOOR); with `cuda_version` (`torch.version.cuda`), block
    scaling's CUDA need — both checked here so that the run stops when its config is built, not at the first
    forward. None for either skips that check (the pure table)."""
    if recipe not in FP8_RECIPES:
        raise ValueError(f"unknown FP8 recipe {recipe!r}; choose from {FP8_RECIPES}")
    if capability is None:
        return "FP8 needs a CUDA device"
    arch = f"sm{capability[0]}{capability[1]}"
    if tuple(capability) < (8, 9):
        return f"TE runs FP8 only on sm89 or newer, this GPU is {arch}"
    te = _release(te_version)
    if te is not None and te[:2] < RECIPE_TE_FLOOR[recipe]:
        floor = ".".join(map(str, RECIPE_TE_FLOOR[recipe]))
        return (f"precision.fp8_recipe {recipe}: megatron-core builds this recipe only with Transformer Engine >= "
                f"{floor}, this is TE {te_version}; install transformer-engine[pytorch]>={floor} or use tensorwise")
    if recipe == "mxfp8" and not (10, 0) <= tuple(capability) < (12, 0):
        return (f"precision.fp8_recipe mxfp8: TE runs MXFP8 only on sm100-sm110 (Blackwell), this GPU is {arch}; "
                f"use tensorwise or delayed")
    if recipe == "blockwise":
        if tuple(capability) < (9, 0):
            return f"precision.fp8_recipe blockwise: TE runs FP8 block scaling only on sm90 or newer, this GPU is {arch}"
        if te is not None and te[:2] < BLOCKWISE_ANY_ARCH_TE and tuple(capability) >= (10, 0):
            return (f"precision.fp8_recipe blockwise: TE {te_version} runs FP8 block scaling on Hopper only "
                    f"(sm90-sm9x; any sm90+ from TE 2.9), this GPU is {arch}")
        if cuda_version is not None or te is not None:
            cuda = _release(cuda_version)
            if cuda is None or cuda[:2] < BLOCKWISE_MIN_CUDA:
                return (f"precision.fp8_recipe blockwise: TE's FP8 block-scaled GEMMs need CUDA >= 12.9, this torch "
                        f"is built for CUDA {cuda_version}; use tensorwise or an image with CUDA >= 12.9")
    return None


def fp8_token_alignment(precision: "PrecisionConfig") -> int:
    """Tokens per micro-batch (per tensor-parallel rank) a GEMM input must be a multiple of: megatron's
    `fp8_utils.get_fp8_align_size` — 32 for MXFP8 (one scale per 32 values along each GEMM dimension), 16 for the
    other FP8 recipes (TE's FP8 GEMMs); 16 without FP8 too (the same padding, whatever the precision)."""
    return 32 if precision.fp8 and precision.fp8_recipe == "mxfp8" else 16


ATTENTION_LAYOUTS = ("padded", "thd")  # [s, b, h, d] rows (sbhd), or packed segments (thd, cu_seqlens)


def attention_layout_name(packed_segments: bool, use_te: bool) -> str:
    """How attention sees a micro-batch: random-length samples and per-document attention cut it into segments,
    which TE layers run as packed THD (mlmclm.model.document_attention); otherwise whole padded rows."""
    return "thd" if packed_segments and use_te else "padded"


DETERMINISTIC_FP8_ATTENTION = (
    "FP8 attention off: deterministic training (deterministic: true) — TE drops its FP8 fused attention under "
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0 (TE 2.2-2.12 always; TE >= 2.13 with cuDNN < 9.19) and no other backend "
    "runs FP8 attention ('no dot product attention backend'); TE >= 2.13 with cuDNN >= 9.19 is unverified here. "
    "Attention runs in bf16, GEMMs in FP8")


def fp8_attention_decision(capability: tuple[int, int] | None, head_dim: int, recipe: str, layout: str,
                           training: bool = True, deterministic: bool = False) -> tuple[bool, str]:
    """Whether TE's FP8 dot-product attention can run for this GPU, shape, FP8 recipe and attention layout; the
    reason in one line.

    Pure, so it is tested over architectures without one. From TE's backend selection
    (`nvte_get_fused_attn_backend` in common/fused_attn/fused_attn.cpp and `get_attention_backend` in
    pytorch/attention/dot_product_attention/utils.py, TE 2.4-2.20): FP8 attention runs only in cuDNN's fused
    attention — FP8 turns off flash attention in training and the unfused path (which only emulates FP8 on request)
    — so when the fused backend is filtered out TE raises "no dot product attention backend". The fused FP8 kernel
    takes only padded layouts (qkv_format bshd or sbhd; bhsd too from cuDNN 9.21) — never THD, so packed segments
    (random-length samples, per-document attention) always run attention in bf16. It needs sm90+ and cuDNN >= 9.7 for
    these shapes; head_dim a multiple of 16; on sm90 training only head_dim 128 (inference up to 256); on sm100 up to
    128. Per recipe: delayed scaling on sm90+; current scaling ("tensorwise") only on sm100+ with cuDNN >= 9.14;
    MXFP8 only on sm100+ with cuDNN >= 9.21 and TE >= 2.16; block scaling never. Where support depends on versions
    we have not run, the answer is off.

    `deterministic` (the run's `deterministic: true`, which sets NVTE_ALLOW_NONDETERMINISTIC_ALGO=0): TE's
    determinism filter in `get_attention_backend` drops the FP8 fused backend in training — on every GPU in TE
    2.2-2.12, and in TE >= 2.13 below sm90 or with cuDNN < 9.19 — and FP8 rules out the other backends, so the
    first step would fail with "no dot product attention backend". TE >= 2.13 with cuDNN >= 9.19 keeps it, but
    nobody here has run that: deterministic training keeps attention in bf16.
    """
    if layout not in ATTENTION_LAYOUTS:
        raise ValueError(f"unknown attention layout {layout!r}; choose from {ATTENTION_LAYOUTS}")
    if recipe not in FP8_RECIPES:
        raise ValueError(f"unknown FP8 recipe {recipe!r}; choose from {FP8_RECIPES}")
    on, why = _fp8_attention_support(capability, head_dim, recipe, layout, training)
    if on and deterministic and training:
        return False, DETERMINISTIC_FP8_ATTENTION
    return on, why


def _fp8_attention_support(capability, head_dim: int, recipe: str, layout: str, training: bool) -> tuple[bool, str]:
    """TE's support table for FP8 attention, determinism aside (see `fp8_attention_decision`)."""
    if capability is None:
        return False, "FP8 attention off: no CUDA device"
    major, minor = capability
    arch = f"sm{major}{minor}"
    mode = "training" if training else "inference"
    if layout == "thd":
        return False, ("FP8 attention off: TE's FP8 fused attention takes only padded layouts (bshd/sbhd), and "
                       "random-length samples or per-document attention run attention as packed THD segments; "
                       "attention runs in bf16, GEMMs in FP8")
    if major < 9:
        return False, (f"FP8 attention off: TE's FP8 fused attention needs sm90 or newer, this GPU is {arch}; "
                       f"attention runs in bf16")
    if recipe == "blockwise":
        return False, ("FP8 attention off: TE has no attention backend for the blockwise (Float8BlockScaling) recipe "
                       "(it would fail with 'no dot product attention backend'); attention runs in bf16, GEMMs in FP8")
    if major > 10:
        return False, f"FP8 attention off: {arch} is not in our support table (unverified); attention runs in bf16"
    if head_dim % 16:
        return False, f"FP8 attention off: TE's FP8 fused attention needs head_dim divisible by 16, got {head_dim}"
    if major == 9:
        if recipe == "tensorwise":
            return False, ("FP8 attention off: TE runs FP8 attention with current scaling (tensorwise) only on sm100+; "
                           "on Hopper it fails with 'no dot product attention backend'; attention runs in bf16, "
                           "GEMMs in FP8")
        if recipe == "mxfp8":
            return False, "FP8 attention off: TE's MXFP8 attention needs sm100+ (MXFP8 itself is Blackwell-only)"
        if training and head_dim != 128:
            return False, (f"FP8 attention off: TE's FP8 fused attention on Hopper trains only with head_dim 128, "
                           f"this model has head_dim {head_dim}; attention runs in bf16, GEMMs in FP8")
        if not training and head_dim > 256:
            return False, f"FP8 attention off: on Hopper FP8 attention takes head_dim <= 256, got {head_dim}"
        return True, f"FP8 attention on ({arch}, head_dim {head_dim}, delayed scaling, {mode}; needs cuDNN >= 9.7)"
    # sm100 (Blackwell)
    if head_dim > 128:
        return False, f"FP8 attention off: on {arch} TE's FP8 fused attention takes head_dim <= 128, got {head_dim}"
    if recipe == "tensorwise":
        return False, (f"FP8 attention off: current scaling (tensorwise) on {arch} needs cuDNN >= 9.14 and TE >= 2.9 "
                       f"and has not been run by us (unverified); attention runs in bf16")
    if recipe == "mxfp8":
        return False, (f"FP8 attention off: MXFP8 attention on {arch} needs TE >= 2.16 with cuDNN >= 9.21 (not "
                       f"9.23.0/9.23.1) and has not been run by us (unverified); attention runs in bf16")
    return True, f"FP8 attention on ({arch}, head_dim {head_dim}, delayed scaling, {mode}; needs cuDNN >= 9.7)"


def fp8_attention_here(head_dim: int, recipe: str, layout: str, training: bool = True,
                       deterministic: bool = False) -> tuple[bool, str]:
    """`fp8_attention_decision` for this machine: TE must be importable, then the GPU's compute capability decides."""
    from mlmclm.parallel.runtime import gpu_capability

    ok, why = transformer_engine_available()
    if not ok:
        return False, f"FP8 attention off: {why}"
    return fp8_attention_decision(gpu_capability(), head_dim, recipe, layout, training, deterministic)
