"""ModelConfig ↔ Hugging Face configs (EuroBERT written; EuroBERT and Llama-family read, with clear refusals)."""
from __future__ import annotations

from dataclasses import dataclass

from mlmclm.model.config import ModelConfig


class UnsupportedModelError(ValueError):
    """The source model uses something our megatron EuroBERT cannot represent exactly."""


# megatron's GPTModel applies Llama-3 RoPE scaling with only the factor configurable; these are fixed there
# (megatron/core/models/common/embeddings/rotary_pos_embedding.py, `_apply_scaling`).
MEGATRON_LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
SUPPORTED_MODEL_TYPES = ("eurobert", "llama")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def rope_parameters(model: ModelConfig) -> dict:
    """HF `rope_parameters` for the RoPE our model computes (see build_model: theta, optional Llama-3 factor)."""
    if not model.rope_scaling:
        return {"rope_type": "default", "rope_theta": float(model.rope_theta)}
    return {"rope_type": "llama3", "rope_theta": float(model.rope_theta),
            "factor": float(model.rope_scaling.get("factor", 8.0)), **MEGATRON_LLAMA3_FIXED}


def eurobert_config(model: ModelConfig, special_ids: dict, dtype: str):
    """A native transformers EuroBertConfig for `model`; `special_ids` has bos_id/eos_id/pad_id/mask_id."""
    from transformers import EuroBertConfig

    return EuroBertConfig(
        vocab_size=model.vocab_size, hidden_size=model.hidden_size, intermediate_size=model.ffn_hidden_size,
        num_hidden_layers=model.num_layers, num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_kv_heads, head_dim=model.head_dim, hidden_act="silu",
        max_position_embeddings=model.max_position_embeddings, initializer_range=model.init_std,
        rms_norm_eps=model.norm_eps, rope_parameters=rope_parameters(model), tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, bos_token_id=special_ids.get("bos_id"),
        eos_token_id=special_ids.get("eos_id"), pad_token_id=special_ids.get("pad_id"),
        mask_token_id=special_ids.get("mask_id"), architectures=["EuroBertForMaskedLM"], dtype=DTYPES[dtype],
    )


@dataclass
class SourceModel:
    model: ModelConfig
    model_type: str
    tied_embeddings: bool  # the LM head is the input embedding (no lm_head tensor saved)
    dtype: str | None


def _rope_scaling(params: dict | None, where: str) -> tuple[float, dict | None]:
    params = dict(params or {})
    theta = params.get("rope_theta")
    if theta is None:
        raise UnsupportedModelError(f"{where}: config has no rope_theta")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return float(theta), None
    if kind != "llama3":
        raise UnsupportedModelError(
            f"{where}: RoPE scaling type {kind!r} is not supported (megatron's GPTModel implements only "
            f"Llama-3 scaling); supported: default, llama3")
    for key, fixed in MEGATRON_LLAMA3_FIXED.items():
        if float(params.get(key, fixed)) != fixed:
            raise UnsupportedModelError(
                f"{where}: Llama-3 RoPE scaling with {key}={params.get(key)} is not supported: megatron's GPTModel "
                f"fixes {key}={fixed} (only the factor is configurable)")
    return float(theta), {"rope_type": "llama3", "factor": float(params.get("factor", 8.0)),
                          **MEGATRON_LLAMA3_FIXED}


def model_config_from_hf(hf, name: str, make_vocab_divisible_by: int = 128) -> SourceModel:
    """Our ModelConfig from a transformers config object; refuses what the EuroBERT blocks cannot reproduce."""
    where = f"HF model {name!r}"
    model_type = getattr(hf, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"{where}: model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)} "
            f"(Llama-family causal LMs and native EuroBERT)")
    if getattr(hf, "attention_bias", False) or getattr(hf, "mlp_bias", False):
        raise UnsupportedModelError(
            f"{where}: attention/MLP biases (attention_bias={getattr(hf, 'attention_bias', False)}, "
            f"mlp_bias={getattr(hf, 'mlp_bias', False)}) are not supported: our blocks have no linear biases")
    if getattr(hf, "hidden_act", "silu") != "silu":
        raise UnsupportedModelError(f"{where}: hidden_act {hf.hidden_act!r} is not supported (SwiGLU/silu only)")
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    if head_dim * hf.num_attention_heads != hf.hidden_size:
        raise UnsupportedModelError(
            f"{where}: head_dim {head_dim} × {hf.num_attention_heads} heads != hidden_size {hf.hidden_size}; our "
            f"blocks need head_dim = hidden_size / num_attention_heads")
    theta, scaling = _rope_scaling(getattr(hf, "rope_parameters", None), where)
    tied = bool(getattr(hf, "tie_word_embeddings", False))
    if model_type == "eurobert" and tied:
        raise UnsupportedModelError(f"{where}: tied EuroBERT embeddings are not expected (EuroBERT unties them)")
    try:
        model = ModelConfig(
            num_layers=hf.num_hidden_layers, hidden_size=hf.hidden_size, num_attention_heads=hf.num_attention_heads,
            num_kv_heads=hf.num_key_value_heads or hf.num_attention_heads, ffn_hidden_size=hf.intermediate_size,
            vocab_size=hf.vocab_size, max_position_embeddings=hf.max_position_embeddings, rope_theta=theta,
            rope_scaling=scaling, norm_eps=float(hf.rms_norm_eps), init_std=float(hf.initializer_range),
            make_vocab_divisible_by=make_vocab_divisible_by, name=name)
    except ValueError as err:
        raise UnsupportedModelError(f"{where}: {err}") from err
    dtype = getattr(hf, "dtype", None)
    return SourceModel(model, model_type, tied, str(dtype) if dtype is not None else None)
