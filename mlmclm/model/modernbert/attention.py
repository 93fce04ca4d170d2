"""ModernBERT's attention on megatron's layers: a window on the local layers, and their own RoPE θ.

Which layers are local is megatron's own setting (`TransformerConfig.window_size` = (w, w) with
`window_attn_skip_freq` = 1 for a local layer, 0 for a global one, per layer); Transformer Engine's attention reads it
when it is built. megatron's local attention reads it too, but applies a *causal* window and drops the mask it was
given (`FusedScaleMaskSoftmax.forward_torch_softmax`, megatron-core 0.19): `WindowedDotProductAttention` takes the
window out of megatron's softmax and builds the whole mask itself — the band |query − key| <= w (Hugging Face
ModernBERT's `sliding_window`), the causal triangle in a CLM phase, and whatever mask the batch brought (padding, the
block-diagonal mask of per-document attention) — so a document shorter than the window still sees only itself.

RoPE: megatron computes one rotary embedding per forward, at the model's θ (ModernBERT's global θ);
`LocalThetaSelfAttention` replaces it on local layers with the same positions at the local θ.
"""
from __future__ import annotations

from functools import lru_cache

import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.utils import is_layer_window_attention

from mlmclm.parallel.runtime import current_device


@lru_cache(maxsize=16)
def window_band(queries: int, keys: int, half_window: int, causal: bool, device: torch.device) -> torch.Tensor:
    """[1, 1, q, k] bool, True where a key is outside the window (megatron's convention: True = not attended)."""
    q = torch.arange(queries, device=device).unsqueeze(1)
    k = torch.arange(keys, device=device).unsqueeze(0)
    outside = (q - k).abs() > half_window
    if causal:
        outside |= k > q
    return outside.view(1, 1, queries, keys)


class WindowedDotProductAttention(DotProductAttention):
    """megatron's local attention, with ModernBERT's bidirectional window on the layers the config makes local."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, **kwargs):
        super().__init__(config, layer_number, attn_mask_type, attention_type, **kwargs)
        window = self.scale_mask_softmax.window_size
        self.half_window = None if window is None else int(window[0])
        self.scale_mask_softmax.window_size = None  # the mask below replaces megatron's causal window
        # The causal triangle is in our mask: the softmax must apply the mask given (mlmclm.model.build.set_causal)
        self.scale_mask_softmax.mask_carries_causality = self.half_window is not None

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if self.half_window is not None:
            causal = bool(getattr(self.scale_mask_softmax, "phase_is_causal", False))
            band = window_band(query.shape[0], key.shape[0], self.half_window, causal, query.device)
            attention_mask = band if attention_mask is None else attention_mask | band
        return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params)


class LocalThetaSelfAttention(SelfAttention):
    """Self-attention whose local layers rotate queries and keys with their own RoPE θ (`local_rope_theta`)."""

    def __init__(self, config, submodules, layer_number, local_rope_theta: float | None = None, **kwargs):
        super().__init__(config, submodules, layer_number, **kwargs)
        self.local_rotary = None
        if local_rope_theta is not None and is_layer_window_attention(config.window_size, config.window_attn_skip_freq,
                                                                       layer_number):
            rotary = RotaryEmbedding(kv_channels=config.kv_channels, rotary_percent=1.0,
                                     rotary_interleaved=config.rotary_interleaved, rotary_base=local_rope_theta,
                                     use_cpu_initialization=True)
            rotary.inv_freq = rotary.inv_freq.to(current_device())
            self.local_rotary = rotary
        self.local_rope_theta = local_rope_theta if self.local_rotary is not None else None

    def forward(self, hidden_states, attention_mask, *args, rotary_pos_emb=None, **kwargs):
        if self.local_rotary is not None and rotary_pos_emb is not None:
            # The model's embedding covers positions 0..len-1 (megatron's `get_rotary_seq_len`; context
            # parallelism, which would slice it, is refused by ParallelConfig): the same positions at the local θ.
            length = (rotary_pos_emb[0] if isinstance(rotary_pos_emb, tuple) else rotary_pos_emb).shape[0]
            rotary_pos_emb = self.local_rotary(length)
        return super().forward(hidden_states, attention_mask, *args, rotary_pos_emb=rotary_pos_emb, **kwargs)
