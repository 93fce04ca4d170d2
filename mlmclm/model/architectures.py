"""What differs between the architectures the trainer builds, in one place: each one's layer specs, megatron
settings, build-time additions and Hugging Face mapping table. The builder (build.py), the weight helpers
(weights.py) and the converters ask this module; nothing else tests `architecture`.

| | EuroBERT | ModernBERT |
|---|---|---|
| norms | RMSNorm | LayerNorm without bias, + an embedding norm |
| MLP | SwiGLU | GeGLU (exact GELU) |
| attention | global, GQA | global/local by layer (window), MHA, RoPE θ per layer type |
| LM head | untied linear | dense → GELU → LayerNorm, decoder tied to the embedding, with a bias |
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch.nn.functional as F
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig

from mlmclm.model import hf_mapping, spec
from mlmclm.model.config import ModelConfig
from mlmclm.model.modernbert import hf_mapping as modernbert_mapping
from mlmclm.model.modernbert.head import FinalNormAndHead, add_decoder_bias
from mlmclm.model.modernbert.spec import layer_spec as modernbert_layer_spec
from mlmclm.model.norm import RMSNorm


@dataclass(frozen=True)
class Architecture:
    mappings: tuple[hf_mapping.ParamMapping, ...]
    tied: dict[str, str]  # megatron parameter -> the tensor it copies
    tied_embeddings: bool  # GPTModel's share_embeddings_and_output_weights
    config_kwargs: Callable[[ModelConfig], dict]  # TransformerConfig fields
    block_spec: Callable[[ModelConfig, TransformerConfig, bool, int | None], TransformerBlockSubmodules]
    finish: Callable[[object, ModelConfig], None]  # on each built GPTModel chunk


def _eurobert_config(model: ModelConfig) -> dict:
    return dict(normalization="RMSNorm", gated_linear_unit=True, activation_func=F.silu)


def _eurobert_block(model: ModelConfig, config: TransformerConfig, use_te: bool,
                    vp_stage: int | None) -> TransformerBlockSubmodules:
    return spec.block_spec(config, use_te, vp_stage)


def _modernbert_config(model: ModelConfig) -> dict:
    # megatron's window setting, per layer (1: local); TE's attention and WindowedDotProductAttention read it.
    # bias_activation_fusion off: megatron's fused GeGLU is the tanh approximation of GELU, ModernBERT's is exact.
    return dict(normalization="LayerNorm", gated_linear_unit=True, activation_func=F.gelu,
                window_size=(model.half_window, model.half_window),
                window_attn_skip_freq=[int(local) for local in model.local_layers()],
                bias_activation_fusion=False)


def _modernbert_block(model: ModelConfig, config: TransformerConfig, use_te: bool,
                      vp_stage: int | None) -> TransformerBlockSubmodules:
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
    count = get_num_layers_to_build(config, vp_stage=vp_stage)
    layers: list[ModuleSpec] = [modernbert_layer_spec(offset + i == 0, use_te, model.local_rope_theta)
                                for i in range(count)]
    return TransformerBlockSubmodules(layer_specs=layers, layer_norm=FinalNormAndHead)


def _modernbert_finish(gpt, model: ModelConfig) -> None:
    if gpt.post_process:
        add_decoder_bias(gpt.output_layer)
    for layer in gpt.decoder.layers:  # TE's attention keeps its window; set_causal re-sets it per phase
        core = layer.self_attention.core_attention
        core.mlmclm_half_window = model.half_window if model.local_layers()[layer.layer_number - 1] else None


ARCHITECTURES: dict[str, Architecture] = {
    "eurobert": Architecture(hf_mapping.MAPPINGS, {}, False, _eurobert_config, _eurobert_block,
                             lambda gpt, model: None),
    "modernbert": Architecture(modernbert_mapping.MAPPINGS, modernbert_mapping.TIED, True, _modernbert_config,
                               _modernbert_block, _modernbert_finish),
}
ALL_TABLES = tuple(arch.mappings for arch in ARCHITECTURES.values())
# a tied copy's name -> the tensor it copies, in models that tie them (`share_embeddings_and_output_weights`)
TIED_COPIES = {copy: source for arch in ARCHITECTURES.values() if arch.tied_embeddings
               for copy, source in arch.tied.items()}


def architecture(model: ModelConfig) -> Architecture:
    return ARCHITECTURES[model.architecture]


def mapping_table(model: ModelConfig) -> tuple[hf_mapping.ParamMapping, ...]:
    return architecture(model).mappings


def split_of(name: str) -> str:
    """The TP split kind of any megatron parameter name of any architecture (tied copies included)."""
    return hf_mapping.split_of(name, ALL_TABLES)
