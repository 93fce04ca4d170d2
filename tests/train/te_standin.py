"""A CPU stand-in for megatron-core's Transformer Engine layer spec: the local modules, plus the `_extra_state` entry
each TE module puts in its state dict.

How the key list was derived (megatron-core 0.19.2, `get_gpt_layer_with_transformer_engine_submodules`, dense
branch, and TE's modules):
- `self_attention.linear_qkv` = TELayerNormColumnParallelLinear: `weight`, `layer_norm_weight`, `_extra_state`;
- `self_attention.core_attention` = TEDotProductAttention: `_extra_state` only, in its state dict — megatron's
  `TEDotProductAttention.sharded_state_dict` leaves it out of dist checkpoints;
- `self_attention.linear_proj` = TERowParallelLinear, `mlp.linear_fc2` = TERowParallelLinear: `weight`, `_extra_state`;
- `mlp.linear_fc1` = TELayerNormColumnParallelLinear: `weight`, `layer_norm_weight`, `_extra_state`;
- `input_layernorm` / `pre_mlp_layernorm` = IdentityOp (the norms are fused into the linears above);
- the block's final norm = TENorm → TE's RMSNorm (a fusible operation): `weight`, `_extra_state`.
megatron's local spec maps its `input_layernorm.` / `pre_mlp_layernorm.` to the fused `…layer_norm_` names in
dist checkpoints (`sharded_state_dict_keys_map`), and megatron's local linears store an empty `_extra_state` of
their own; so a local checkpoint and a TE one differ only in `_extra_state` entries (the final norm's), and a TE
model asks for one no checkpoint has (attention's). This stand-in reproduces exactly that, on modules that run on
CPU (local attention's `sharded_state_dict` leaves its extra state out, as TE's does).

The extra state itself is TE's, as a delayed-scaling FP8 run stores it: the linears and the final norm carry the
FP8 metadata pickle of tests/stand_ins/te/transformer_engine/pytorch/module/base.py and load it through TE >= 2.18's
refusal rule (`_extra_state.py`: a delayed-scaling payload only with NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1), so a
resume of such a checkpoint is tested against the rule TE applies.
"""
import dataclasses
import functools
import itertools

import torch
from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

from mlmclm.model.norm import RMSNorm
from mlmclm.model.spec import local_layer_spec

from tests.stand_ins import transformer_engine_stand_in  # noqa: E402

transformer_engine_stand_in.install()  # this rank is the stand-in's for its life (a spawned scenario process)
from transformer_engine.pytorch.module.base import FP8ExtraState  # noqa: E402

_module_seeds = itertools.count(1)


class _WithExtraState(FP8ExtraState):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.init_fp8_meta(delayed=True, seed=float(next(_module_seeds)))


class TEColumnParallelLinearStandIn(_WithExtraState, ColumnParallelLinear):
    pass


class TERowParallelLinearStandIn(_WithExtraState, RowParallelLinear):
    pass


class TEDotProductAttentionStandIn(_WithExtraState, DotProductAttention):
    pass


class TENormStandIn(_WithExtraState, RMSNorm):
    pass


def te_keyed_block_spec(config, use_te: bool, vp_stage=None) -> TransformerBlockSubmodules:
    """Drop-in for `mlmclm.model.spec.block_spec` that builds the stand-in."""
    layer = local_layer_spec()
    attention = layer.submodules.self_attention.submodules
    attention.linear_qkv = TEColumnParallelLinearStandIn
    attention.core_attention = TEDotProductAttentionStandIn
    attention.linear_proj = TERowParallelLinearStandIn
    mlp = layer.submodules.mlp  # megatron 0.19: a partial of MLP.as_mlp_submodule(submodules=MLPSubmodules)
    layer.submodules.mlp = functools.partial(mlp.func, *mlp.args, **{**mlp.keywords, "submodules": dataclasses.replace(
        mlp.keywords["submodules"], linear_fc1=TEColumnParallelLinearStandIn, linear_fc2=TERowParallelLinearStandIn)})
    num_layers = get_num_layers_to_build(config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=[layer] * num_layers, layer_norm=TENormStandIn)


class RowParallelLinearWithBias(RowParallelLinear):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **{**kwargs, "bias": True})


def biased_block_spec(config, use_te: bool, vp_stage=None) -> TransformerBlockSubmodules:
    """A genuinely different model: an attention-output bias that no EuroBERT checkpoint has."""
    layer = local_layer_spec()
    layer.submodules.self_attention.submodules.linear_proj = RowParallelLinearWithBias
    num_layers = get_num_layers_to_build(config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=[layer] * num_layers, layer_norm=RMSNorm)
