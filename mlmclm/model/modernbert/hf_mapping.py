"""ModernBERT's table between megatron-core names and Hugging Face `ModernBertForMaskedLM` names.

Read with mlmclm/model/hf_mapping.py (the split kinds, and what one HF name on a QKV or GATE_UP entry means).
Where ModernBERT's parts sit in our megatron model (mlmclm/model/modernbert/spec.py, head.py):
- the embedding norm is layer 0's input norm; layers 1.. have their own (`attn_norm`), layer 0 has none in HF;
- `Wqkv` is [q; k; v] over all heads, `Wi` is [activated half; gate half], megatron's fused layouts once split
  per attention head;
- the prediction head (dense, norm) lives in the block's final norm module, after the final norm;
- the decoder is tied to the input embedding: its weight has no entry (transformers saves none either), its bias
  is the output layer's. On a last pipeline stage without the embedding, megatron keeps its own copy of the tied
  weight, `output_layer.weight`: `TIED` says which tensor fills it.
"""
from __future__ import annotations

from mlmclm.model.hf_mapping import (COLUMNS, FIRST_LAYER, GATE_UP, LATER_LAYERS, QKV, REPLICATED, ROWS,
                                     ParamMapping)

_LAYER = "model.layers.{layer}."

MAPPINGS: tuple[ParamMapping, ...] = (
    ParamMapping("embedding.word_embeddings.weight", ("model.embeddings.tok_embeddings.weight",), ROWS),
    ParamMapping("decoder.layers.{layer}.input_layernorm.weight", ("model.embeddings.norm.weight",), REPLICATED,
                 layers=FIRST_LAYER),
    ParamMapping("decoder.layers.{layer}.input_layernorm.weight", (_LAYER + "attn_norm.weight",), REPLICATED,
                 layers=LATER_LAYERS),
    ParamMapping("decoder.layers.{layer}.self_attention.linear_qkv.weight", (_LAYER + "attn.Wqkv.weight",), QKV),
    ParamMapping("decoder.layers.{layer}.self_attention.linear_proj.weight", (_LAYER + "attn.Wo.weight",), COLUMNS),
    ParamMapping("decoder.layers.{layer}.pre_mlp_layernorm.weight", (_LAYER + "mlp_norm.weight",), REPLICATED),
    ParamMapping("decoder.layers.{layer}.mlp.linear_fc1.weight", (_LAYER + "mlp.Wi.weight",), GATE_UP),
    ParamMapping("decoder.layers.{layer}.mlp.linear_fc2.weight", (_LAYER + "mlp.Wo.weight",), COLUMNS),
    ParamMapping("decoder.final_layernorm.weight", ("model.final_norm.weight",), REPLICATED),
    ParamMapping("decoder.final_layernorm.head_dense", ("head.dense.weight",), REPLICATED),
    ParamMapping("decoder.final_layernorm.head_norm.weight", ("head.norm.weight",), REPLICATED),
    ParamMapping("output_layer.bias", ("decoder.bias",), ROWS),
)

# megatron parameter -> the megatron tensor it is a copy of (tied weights)
TIED = {"output_layer.weight": "embedding.word_embeddings.weight"}
