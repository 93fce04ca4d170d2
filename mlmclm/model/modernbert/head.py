"""ModernBERT's MLM head on megatron's GPTModel: final norm, then dense → GELU → norm, then the decoder.

megatron's block ends with a final norm and the model with its output layer; ModernBERT's head sits between them.
`FinalNormAndHead` takes the final norm's place in the block (so the output layer, the sparse head and the chunked
head all receive the head's output, on the last pipeline stage only), and `add_decoder_bias` gives the output
layer — tied to the input embedding (`share_embeddings_and_output_weights`) — its vocabulary-parallel bias.

The head's dense layer is replicated on every tensor-parallel rank (h × h, small): without sequence parallelism
each rank computes it for the whole sequence and gets the same gradient; with it, each rank computes its own tokens
and the weight is marked `sequence_parallel`, so megatron sums its gradient over the ranks, as for the norms.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes
from megatron.core.transformer.transformer_config import TransformerConfig

from mlmclm.model.norm import LayerNorm
from mlmclm.parallel.runtime import current_device


class FinalNormAndHead(LayerNorm):
    """ModernBERT's final norm (its own weight: `decoder.final_layernorm.weight`, as EuroBERT's final norm), then
    the prediction head's dense layer without bias, GELU and LayerNorm without bias."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5):
        super().__init__(config, hidden_size, eps)
        self.head_dense = torch.nn.Parameter(torch.empty(hidden_size, hidden_size, dtype=config.params_dtype,
                                                         device=current_device()))
        if config.perform_initialization:
            config.output_layer_init_method(self.head_dense)
        setattr(self.head_dense, "sequence_parallel", config.sequence_parallel)
        self.head_norm = LayerNorm(config, hidden_size, eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = super().forward(hidden_states)
        return self.head_norm(F.gelu(F.linear(hidden_states, self.head_dense)))


def add_decoder_bias(output_layer) -> None:
    """The output layer's bias (ModernBERT's `decoder.bias`): zeros, split over tensor-parallel ranks along the
    vocabulary as the output layer's rows are; megatron's column-parallel linear adds it when it is there."""
    rows = output_layer.output_size_per_partition
    device = current_device()
    dtype = output_layer.config.params_dtype
    output_layer.bias = torch.nn.Parameter(torch.zeros(rows, dtype=dtype, device=device))
    set_tensor_model_parallel_attributes(output_layer.bias, True, 0, 1)
    setattr(output_layer.bias, "allreduce", True)
    output_layer.skip_bias_add = False
