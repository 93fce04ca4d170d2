"""ModernBERT's layers as megatron specs: megatron's own local or Transformer Engine layer, with ModernBERT's parts.

- LayerNorm without bias before attention and MLP (`mlmclm.model.norm.LayerNorm`, also on TE layers: TE's norms
  always carry a bias, so the norms stay ours and the linears are TE's plain ones, unfused with the norm);
- GeGLU: megatron's gated MLP with exact GELU (`activation_func`, in `mlmclm.model.architectures`);
- attention with a window on the local layers and their own RoPE θ (attention.py);
- layer 0: no norm of its own before attention; the embedding norm stands there instead (`EmbeddingNorm`), whose
  output is also the residual — ModernBERT's `embeddings.norm`, then a first layer whose `attn_norm` is the identity.

Checkpoint keys follow megatron's local spec on both specs (its `sharded_state_dict_keys_map`), so a ModernBERT
checkpoint reads the same whichever spec wrote it, and `mlmclm.convert.dist_reader` reads it as it reads EuroBERT's.
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial

from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.spec_utils import ModuleSpec

from mlmclm.model.modernbert.attention import LocalThetaSelfAttention, WindowedDotProductAttention
from mlmclm.model.norm import LayerNorm


class EmbeddingNorm(LayerNorm):
    """Layer 0's input norm: ModernBERT's embedding norm. It hands megatron's layer (output, residual) — both the
    normed embedding — as a norm may (megatron-core 0.19 `TransformerLayer._forward_attention`), so the residual
    stream starts from the normed embedding, as in ModernBERT."""

    def forward(self, hidden_states):
        normed = super().forward(hidden_states)
        return normed, normed


def layer_spec(first: bool, use_te: bool, local_rope_theta: float) -> ModuleSpec:
    """The spec of one layer (`first`: the model's layer 0)."""
    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    keys_map = dict(spec.submodules.sharded_state_dict_keys_map)
    attention = spec.submodules.self_attention
    if use_te:
        from megatron.core.extensions.transformer_engine import (TEColumnParallelLinear, TEDotProductAttention,
                                                                 TERowParallelLinear)

        linear, row, core = TEColumnParallelLinear, TERowParallelLinear, TEDotProductAttention
    else:
        linear, row, core = attention.submodules.linear_qkv, attention.submodules.linear_proj, \
            WindowedDotProductAttention
    attention = ModuleSpec(module=LocalThetaSelfAttention,
                           params={**attention.params, "local_rope_theta": local_rope_theta},
                           submodules=replace(attention.submodules, linear_qkv=linear, core_attention=core,
                                              linear_proj=row))
    mlp = partial(MLP.as_mlp_submodule, submodules=MLPSubmodules(linear_fc1=linear, linear_fc2=row))
    submodules = replace(spec.submodules, input_layernorm=EmbeddingNorm if first else LayerNorm,
                         self_attention=attention, pre_mlp_layernorm=LayerNorm, mlp=mlp,
                         sharded_state_dict_keys_map=keys_map)
    return ModuleSpec(module=spec.module, params=dict(spec.params), submodules=submodules)
