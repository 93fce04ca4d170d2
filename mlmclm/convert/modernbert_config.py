"""ModelConfig ↔ Hugging Face `ModernBertConfig`, with a clear refusal of what our ModernBERT blocks do not compute.

Read: any `ModernBertForMaskedLM` configuration of the released families (ModernBERT, ModernCamemBERT, Ettin's
encoders, mmBERT, the -bio variants) — exact GELU, no linear or norm biases, a tied decoder with a bias, default RoPE
on both layer types. Anything else is refused naming the field, since converting it would silently change the model.
"""
from __future__ import annotations

from mlmclm.convert.hf_config import DTYPES, SourceModel, UnsupportedModelError
from mlmclm.model.config import ModelConfig

# HF layer type <-> ours
HF_LAYER_TYPES = {"full_attention": "global", "sliding_attention": "local"}
OURS_TO_HF = {ours: hf for hf, ours in HF_LAYER_TYPES.items()}
# What our blocks compute; a source with another value is refused (field: value we need)
FIXED = {"hidden_activation": "gelu", "classifier_activation": "gelu", "norm_bias": False, "attention_bias": False,
         "mlp_bias": False, "classifier_bias": False, "decoder_bias": True, "tie_word_embeddings": True}


def _theta(params: dict | None, layer_type: str, where: str) -> float:
    params = dict(params or {})
    kind = params.get("rope_type", "default")
    if kind != "default":
        raise UnsupportedModelError(f"{where}: RoPE type {kind!r} on the {layer_type} layers is not supported "
                                    f"(ModernBERT's default RoPE only)")
    if params.get("rope_theta") is None:
        raise UnsupportedModelError(f"{where}: no rope_theta for the {layer_type} layers")
    return float(params["rope_theta"])


def model_config_from_modernbert(hf, name: str, make_vocab_divisible_by: int = 128) -> SourceModel:
    where = f"HF model {name!r}"
    for field, needed in FIXED.items():
        value = getattr(hf, field, needed)
        if value != needed:
            raise UnsupportedModelError(f"{where}: {field}={value!r} is not supported: our ModernBERT computes "
                                        f"{field}={needed!r}")
    if hf.hidden_size % hf.num_attention_heads:
        raise UnsupportedModelError(f"{where}: hidden_size {hf.hidden_size} is not divisible by num_attention_heads "
                                    f"{hf.num_attention_heads}")
    unknown = sorted(set(hf.layer_types) - set(HF_LAYER_TYPES))
    if unknown:
        raise UnsupportedModelError(f"{where}: layer types {unknown} are not supported (full_attention and "
                                    f"sliding_attention only)")
    rope = hf.rope_parameters or {}
    try:
        model = ModelConfig(
            num_layers=hf.num_hidden_layers, hidden_size=hf.hidden_size, num_attention_heads=hf.num_attention_heads,
            num_kv_heads=hf.num_attention_heads, ffn_hidden_size=hf.intermediate_size, vocab_size=hf.vocab_size,
            max_position_embeddings=hf.max_position_embeddings,
            rope_theta=_theta(rope.get("full_attention"), "global", where), norm_eps=float(hf.norm_eps),
            init_std=float(hf.initializer_range), make_vocab_divisible_by=make_vocab_divisible_by, name=name,
            architecture="modernbert", layer_types=[HF_LAYER_TYPES[t] for t in hf.layer_types],
            local_attention=int(hf.local_attention),
            local_rope_theta=_theta(rope.get("sliding_attention"), "local", where))
    except ValueError as err:
        raise UnsupportedModelError(f"{where}: {err}") from err
    dtype = getattr(hf, "dtype", None)
    return SourceModel(model, "modernbert", tied_embeddings=True, dtype=str(dtype) if dtype is not None else None)


def rope_parameters(model: ModelConfig) -> dict:
    return {"full_attention": {"rope_type": "default", "rope_theta": float(model.rope_theta)},
            "sliding_attention": {"rope_type": "default", "rope_theta": float(model.local_rope_theta)}}


def modernbert_fields(model: ModelConfig, special_ids: dict, dtype: str) -> dict:
    """The `ModernBertConfig` fields of `model` (what the export writes and its verification expects). The CLS and
    SEP ids are the tokenizer's BOS and EOS, as in ModernBERT's own tokenizer ([CLS] opens, [SEP] closes)."""
    return dict(
        vocab_size=model.vocab_size, hidden_size=model.hidden_size, intermediate_size=model.ffn_hidden_size,
        num_hidden_layers=model.num_layers, num_attention_heads=model.num_attention_heads,
        max_position_embeddings=model.max_position_embeddings, initializer_range=model.init_std,
        norm_eps=model.norm_eps, layer_types=[OURS_TO_HF[t] for t in model.layer_types],
        local_attention=model.local_attention, rope_parameters=rope_parameters(model),
        bos_token_id=special_ids.get("bos_id"), eos_token_id=special_ids.get("eos_id"),
        pad_token_id=special_ids.get("pad_id"), cls_token_id=special_ids.get("bos_id"),
        sep_token_id=special_ids.get("eos_id"), architectures=["ModernBertForMaskedLM"], dtype=DTYPES[dtype],
        **FIXED)


def modernbert_config(model: ModelConfig, special_ids: dict, dtype: str):
    """A native transformers ModernBertConfig for `model`."""
    from transformers import ModernBertConfig

    return ModernBertConfig(**modernbert_fields(model, special_ids, dtype))
