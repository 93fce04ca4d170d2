"""Estimated peak GPU memory of one training rank, per term, for a micro-batch of a given size.

Memory follows the micro-batch's tail, not its mean: the paper's 12 random-length samples per forward (lengths
uniform in [12, 2048]) average 12 × 1030 = 12,360 tokens but reach 24,576 at worst, and a 42k-step run meets
22-23k. `--plan` (recipes/sweep.py) prints both, and refuses a layout whose worst case does not fit the GPU.

The formula (bytes, per rank; P = parameters on the rank, T = tokens of the micro-batch):

    weights + grads + optimizer = P × (2 [bf16 weights] + 4 [fp32 grad buffer] + 12 / DP [fp32 main weights,
                                  Adam m and v; / DP with the distributed optimizer] (+ 1 with FP8: TE's FP8 copies))
    activations = T × layers_per_stage × in_flight × 2 B × per_token_per_layer
        per_token_per_layer = 4h [the two fused norm+linear inputs and norm outputs; / TP under sequence
                              parallelism] + (3h + 2·g·d + 3F) / TP [q, attention output, projection input, k and v
                              (g KV heads of size d), SwiGLU input (2F) and output (F)]
        in_flight = min(PP, micro-batches per step) (1F1B: the first stage holds that many micro-batches)
    logits = `logits_bytes`: predicted tokens × V / TP × 6 B (bf16 logits and megatron's fp32 cross-entropy copy);
             with the chunked head (`head_chunk_tokens` > 0, mlmclm.model.chunked_head) min(chunk, predicted) × V / TP
             × 6 B (one chunk's fp32 logits, turned into their gradient in place, and their bf16 copy for the matmuls)
             + V / TP × h × 10 B (the fp32 weight gradient, summed in the forward and held until the backward, plus
             a chunk's bf16 product and its fp32 copy while they are added; in the backward its scaled fp32 copy and
             bf16 rounding) + predicted tokens × h × 4 B (the bf16 hidden-state gradient held, and its scaled copy)
    overhead = 4 GiB (CUDA context, cuBLAS/cuDNN workspaces, NCCL buffers, allocator fragmentation)

ModernBERT: its decoder is tied to the input embedding (one vocabulary matrix where both sit on one rank), its
head adds a dense h × h layer on the last stage, and its local (windowed) layers hold the same activations per token
as its global ones: with flash/fused attention neither keeps a T × T term, so the window changes the FLOPs
(mlmclm.flops), not this estimate; megatron's local layers materialise the full T × T scores on windowed layers too
(the window is a mask), which `local_attention_bytes` counts alike.

Assumptions: Transformer Engine attention (flash/fused: no T × T term; megatron's local layers are refused on
such rows, mlmclm.model.document_attention), no activation recomputation, the CLM phase's full-vocabulary head
(MLM's sparse head predicts mask_ratio × T). Unverified on a GPU: `benchmarks/gpu_check.py` measures the peak at
the worst-case micro-batch next to this estimate.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlmclm.model.config import ModelConfig

GIB = 2**30
H100_80GB_BYTES = 81_559 * 2**20  # what an H100 80 GB reports (nvidia-smi: 81559 MiB)
OVERHEAD_BYTES = 4 * GIB


@dataclass(frozen=True)
class RankLayout:
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    sequence_parallel: bool = False
    data_parallel: int = 1
    distributed_optimizer: bool = True
    micro_batches_per_step: int = 1
    fp8: bool = False


@dataclass(frozen=True)
class MemoryEstimate:
    tokens: int
    model_states: int
    activations: int
    logits: int
    overhead: int

    @property
    def total(self) -> int:
        return self.model_states + self.activations + self.logits + self.overhead

    def summary(self) -> str:
        return (f"{self.total / GIB:.1f} GiB at {self.tokens:,} tokens (weights/grads/optimizer "
                f"{self.model_states / GIB:.1f}, activations {self.activations / GIB:.1f}, logits "
                f"{self.logits / GIB:.1f}, overhead {self.overhead / GIB:.1f})")


def parameters_per_rank(model: ModelConfig, layout: RankLayout) -> int:
    """The most parameters any rank holds: its share of the layers, plus the embedding or the output layer
    (both on one rank without pipeline parallelism, a single matrix when they are tied: ModernBERT), and the
    head's own weights (ModernBERT: dense h × h, norm and decoder bias)."""
    h, kv, f = model.hidden_size, model.num_kv_heads * model.head_dim, model.ffn_hidden_size
    layer = h * (h + 2 * kv) + h * h + 3 * h * f + 2 * h
    vocab = model.vocab_size * h
    tp, pp = layout.tensor_parallel, layout.pipeline_parallel
    matrices = 1 if pp > 1 or model.is_modernbert else 2
    head = h * h + h + model.vocab_size // tp if model.is_modernbert else 0
    return (model.num_layers // pp) * layer // tp + vocab // tp * matrices + h + head


def logits_bytes(predicted_tokens: int, vocab_size: int, tensor_parallel: int) -> int:
    """The output layer's logits at the predicted positions: bf16 logits plus the fp32 copy megatron's
    vocab-parallel cross entropy makes (and keeps for backward). One function, so a chunked loss can replace it."""
    return predicted_tokens * (vocab_size // tensor_parallel) * (2 + 4)


def chunked_logits_bytes(predicted_tokens: int, vocab_size: int, tensor_parallel: int, chunk_tokens: int,
                         hidden_size: int) -> int:
    """The chunked head's memory: one chunk's fp32 logits and their bf16 copy; the gradients it makes in the forward
    and holds until the backward (weight shard in fp32, hidden states in bf16) with their transient copies."""
    shard = vocab_size // tensor_parallel
    return (min(chunk_tokens, predicted_tokens) * shard * (4 + 2) + shard * hidden_size * (4 + 2 + 4)
            + predicted_tokens * hidden_size * (2 + 2))


def activation_bytes_per_token_per_layer(model: ModelConfig, layout: RankLayout) -> float:
    h, kv, f = model.hidden_size, model.num_kv_heads * model.head_dim, model.ffn_hidden_size
    tp = layout.tensor_parallel
    norms = 4 * h / (tp if layout.sequence_parallel else 1)
    return 2 * (norms + (3 * h + 2 * kv + 3 * f) / tp)


def estimate_peak_memory(model: ModelConfig, layout: RankLayout, tokens: int,
                         predicted_fraction: float = 1.0, head_chunk_tokens: int = 0) -> MemoryEstimate:
    """The estimate for a micro-batch of `tokens` tokens; `predicted_fraction` of them go through the output layer
    (1 for CLM, the mask ratio for MLM's sparse head), `head_chunk_tokens` at a time (0: megatron's whole head)."""
    params = parameters_per_rank(model, layout)
    optimizer = 12 / (layout.data_parallel if layout.distributed_optimizer else 1)
    model_states = int(params * (2 + 4 + optimizer + (1 if layout.fp8 else 0)))
    in_flight = min(layout.pipeline_parallel, max(1, layout.micro_batches_per_step))
    layers = model.num_layers // layout.pipeline_parallel
    activations = int(tokens * layers * in_flight * activation_bytes_per_token_per_layer(model, layout))
    predicted = int(round(tokens * predicted_fraction))
    if head_chunk_tokens:
        logits = chunked_logits_bytes(predicted, model.vocab_size, layout.tensor_parallel, head_chunk_tokens,
                                      model.hidden_size)
    else:
        logits = logits_bytes(predicted, model.vocab_size, layout.tensor_parallel)
    return MemoryEstimate(tokens, model_states, activations, logits, OVERHEAD_BYTES)
