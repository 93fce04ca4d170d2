"""The chunked head's size setting (mlmclm.model.chunked_head): its default and its check, apart from the head
itself so that reading a config imports neither torch nor megatron-core."""
from __future__ import annotations

# 2048 tokens, chosen for the GPU from a roofline (benchmarks/head_roofline.py; issue 55): each chunk's weight-
# gradient GEMM reads and writes the whole fp32 [V/TP, h] sum, so small chunks make the head memory-bound — at 256
# tokens eurobert-1b's head costs 1.8x megatron's whole head on an H100, at 2048 1.03x (CLM, 10,339 tokens) and
# 1.12x (MLM, 4,136 predicted), within 1.2x for every paper shape from 1,500 predicted tokens. Its price: one chunk's
# logits, 2048 × V/TP × 6 B (1.5 GiB at vocabulary 128,256, TP 1) against megatron's whole-head logits of every
# token. A model, not a GPU measurement: the GPU session's speed rows time it.
DEFAULT_CHUNK_TOKENS = 2048


def validate_chunk_tokens(value) -> int:
    """The chunk size: whole tokens, >= 1 (0 is the config's 'megatron's own head')."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"head chunk size must be a whole number of tokens >= 1, got {value!r}")
    return value
