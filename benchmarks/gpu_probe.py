"""The GPU session's first section: what this machine is and what it can run — versions, device, the layer spec
and fused kernels our builder picks, each FP8 recipe's support (TE floors, CUDA, the GPU), the FP8-attention
decisions for the paper's shapes, and a Transformer Engine smoke test (bf16 and FP8 `te.Linear` forward and
backward, per recipe). Every probe is wrapped: a failure is recorded with its reason, never fatal.

torch.backends.cudnn.version() is read guarded: on an H200 image TE had loaded a system cuDNN (9.14) before
torch's own (9.19), and torch's version check then raised in every later cuDNN call of the process.
"""
from __future__ import annotations

import importlib.metadata
import sys

import torch

from gpu_trainer import on_gpu
from mlmclm.model import PRESETS, PrecisionConfig
from mlmclm.model.build import resolve_use_te
from mlmclm.model.fusions import fusion_flags
from mlmclm.model.precision import (FP8_RECIPES, fp8_attention_decision, fp8_recipe_error, installed_te_version,
                                    transformer_engine_available)

PAPER_MODELS = ("eurobert-210m", "eurobert-610m", "eurobert-1b", "eurobert-2.1b")


def version_of(*dists: str) -> str | None:
    for name in dists:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def cudnn_version() -> int | str | None:
    if not on_gpu():
        return None
    try:
        return torch.backends.cudnn.version()
    except RuntimeError as err:
        return f"unusable: {err}"


def capability() -> tuple[int, int] | None:
    return tuple(torch.cuda.get_device_capability()) if on_gpu() else None


def device() -> dict:
    if not on_gpu():
        return {"name": "cpu", "compute_capability": None, "memory_gib": None}
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"name": torch.cuda.get_device_name(), "compute_capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1)}


def te_version() -> str | None:
    try:
        return installed_te_version()
    except Exception:  # not installed, or a broken build
        return None


def fp8_recipes() -> dict:
    """Per recipe, whether FP8 GEMMs run here (our checks: TE floors, CUDA, the GPU) — None means yes."""
    ok, why = transformer_engine_available()
    if not ok:
        return {recipe: f"no Transformer Engine here: {why}" for recipe in FP8_RECIPES}
    return {recipe: fp8_recipe_error(capability(), recipe, te_version(), torch.version.cuda) for recipe in FP8_RECIPES}


def fp8_attention_table() -> dict:
    """The FP8-attention gate for each paper shape on this GPU (delayed scaling), per layout and mode."""
    out = {}
    for name in PAPER_MODELS:
        head_dim = PRESETS[name].head_dim
        for layout in ("padded", "thd"):
            for deterministic in (False, True):
                on, why = fp8_attention_decision(capability(), head_dim, "delayed", layout, True, deterministic)
                out[f"{name} {layout}{' deterministic' if deterministic else ''}"] = {"on": on, "reason": why}
    return out


def te_smoke() -> dict:
    """bf16 and FP8 (each supported recipe) `te.Linear` forward and backward on the device."""
    if not on_gpu():
        return {"skipped": "no CUDA device"}
    try:
        import transformer_engine.pytorch as te
        from transformer_engine.common import recipe as te_recipe
    except Exception as err:
        return {"skipped": f"transformer_engine not importable ({type(err).__name__}: {err})"}
    out = {}
    layer = te.Linear(256, 256, params_dtype=torch.bfloat16).cuda()
    x = torch.randn(32, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    recipes = {"bf16": None, "tensorwise": "Float8CurrentScaling", "delayed": "DelayedScaling",
               "mxfp8": "MXFP8BlockScaling", "blockwise": "Float8BlockScaling"}
    supported = fp8_recipes()
    for name, cls in recipes.items():
        if cls is not None and supported.get(name):
            out[name] = f"skipped: {supported[name]}"
            continue
        try:
            if cls is None:
                layer(x).float().pow(2).mean().backward()
            else:
                with te.fp8_autocast(enabled=True, fp8_recipe=getattr(te_recipe, cls)()):
                    y = layer(x)
                y.float().sum().backward()
            torch.cuda.synchronize()
            out[name] = "ok"
        except Exception as err:
            out[name] = f"failed: {type(err).__name__}: {str(err)[:300]}"
    return out


def environment() -> dict:
    use_te = resolve_use_te(None)
    te_ok, te_why = transformer_engine_available()
    return {
        "python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": cudnn_version(), "device": device(),
        "transformer_engine": te_version() if te_ok else version_of("transformer_engine", "transformer-engine"),
        "apex": version_of("apex"), "megatron_core": version_of("megatron-core", "megatron_core"),
        "transformers": version_of("transformers"),
        "layer_spec": "transformer_engine" if use_te else "local",
        "layer_spec_reason": te_why if te_ok else f"megatron local layers: {te_why}",
        "fused_kernels": fusion_flags(use_te).summary(use_te),
        "default_precision": PrecisionConfig().resolved_dtype(on_gpu()),
        "fp8_recipes": fp8_recipes(), "fp8_attention": fp8_attention_table(), "te_smoke": te_smoke(),
    }
