"""The Hugging Face config of each architecture, read and written: EuroBERT/Llama (hf_config.py), ModernBERT
(modernbert_config.py). The converters and the recipes ask here, by the source's `model_type` or our
`model.architecture`."""
from __future__ import annotations

from mlmclm.convert.hf_config import SUPPORTED_MODEL_TYPES, SourceModel, UnsupportedModelError, eurobert_config
from mlmclm.convert.hf_config import model_config_from_hf as eurobert_or_llama_from_hf
from mlmclm.convert.hf_config import rope_parameters as eurobert_rope_parameters
from mlmclm.convert.modernbert_config import model_config_from_modernbert, modernbert_config
from mlmclm.convert.modernbert_config import rope_parameters as modernbert_rope_parameters
from mlmclm.model.config import ModelConfig

MODEL_TYPES = (*SUPPORTED_MODEL_TYPES, "modernbert")
HF_CLASSES = {"eurobert": "EuroBertForMaskedLM", "modernbert": "ModernBertForMaskedLM"}


def model_config_from_hf(hf, name: str, make_vocab_divisible_by: int = 128) -> SourceModel:
    """Our ModelConfig from a transformers config object; refuses what our blocks cannot reproduce."""
    model_type = getattr(hf, "model_type", None)
    if model_type == "modernbert":
        return model_config_from_modernbert(hf, name, make_vocab_divisible_by)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(
            f"HF model {name!r}: model_type {model_type!r} is not supported; supported: {', '.join(MODEL_TYPES)} "
            f"(Llama-family causal LMs, native EuroBERT and ModernBERT)")
    return eurobert_or_llama_from_hf(hf, name, make_vocab_divisible_by)


def hf_config(model: ModelConfig, special_ids: dict, dtype: str):
    """The native transformers config our export writes for `model`."""
    if model.is_modernbert:
        return modernbert_config(model, special_ids, dtype)
    return eurobert_config(model, special_ids, dtype)


def rope_parameters(model: ModelConfig) -> dict:
    return modernbert_rope_parameters(model) if model.is_modernbert else eurobert_rope_parameters(model)
