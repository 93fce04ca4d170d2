"""Layer specs: Transformer Engine layers when TE and CUDA are present, megatron's local layers otherwise."""
from __future__ import annotations

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig

from mlmclm.model.norm import RMSNorm


def local_layer_spec() -> ModuleSpec:
    """megatron's local layer with our RMSNorm (megatron's torch norm wrapper refuses sequence parallelism)."""
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    spec.submodules.input_layernorm = RMSNorm
    spec.submodules.pre_mlp_layernorm = RMSNorm
    return spec


def te_layer_spec() -> ModuleSpec:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

    return get_gpt_layer_with_transformer_engine_spec()


def block_spec(config: TransformerConfig, use_te: bool, vp_stage: int | None = None) -> TransformerBlockSubmodules:
    """The decoder block for this pipeline stage (and virtual stage): N identical layers plus the final norm."""
    if use_te:
        from megatron.core.extensions.transformer_engine import TENorm

        layer, final_norm = te_layer_spec(), TENorm
    else:
        layer, final_norm = local_layer_spec(), RMSNorm
    num_layers = get_num_layers_to_build(config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=[layer] * num_layers, layer_norm=final_norm)
