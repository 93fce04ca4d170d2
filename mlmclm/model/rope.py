"""Switch a built model's RoPE base (θ) in place: a long-context phase raises it without rebuilding anything.

RoPE has no weights: megatron's `RotaryEmbedding` keeps its inverse frequencies (`inv_freq`, from θ and, with
Llama-3 scaling, the factor) as a plain attribute, and `forward` is wrapped in an `lru_cache` keyed on the module
and the sequence length (megatron-core 0.19, `models/common/embeddings/rotary_pos_embedding.py`). So a switch must
both replace `inv_freq` and empty that cache: with the new frequencies alone, every sequence length seen before the
switch would keep its old rotary embeddings, silently. The new frequencies come from megatron's own constructor,
so they are exactly those of a model built with the new θ.
"""
from __future__ import annotations

from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

from mlmclm.model.config import ModelConfig


def set_rope_theta(chunks, model: ModelConfig) -> None:
    """Give every chunk the rotary frequencies of `model.rope_theta` (and its scaling); the weights are untouched."""
    for chunk in chunks:
        rotary = chunk.rotary_pos_emb
        fresh = RotaryEmbedding(kv_channels=chunk.config.kv_channels, rotary_percent=1.0,
                                rotary_interleaved=chunk.config.rotary_interleaved,
                                rotary_base=model.rope_theta, rope_scaling=bool(model.rope_scaling),
                                rope_scaling_factor=float((model.rope_scaling or {}).get("factor", 8.0)),
                                use_cpu_initialization=True, cp_group=rotary.cp_group)
        rotary.inv_freq = fresh.inv_freq.to(device=rotary.inv_freq.device, dtype=rotary.inv_freq.dtype)
        chunk.rope_theta = float(model.rope_theta)
    RotaryEmbedding.forward.cache_clear()  # the embeddings of the old θ, for every length already seen


def rope_theta(chunks) -> float:
    """The θ the chunks' rotary embedding uses (the build's, or the last `set_rope_theta`'s)."""
    return chunks[0].rope_theta
