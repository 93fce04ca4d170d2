"""TE's `DotProductAttention` (`transformer_engine/pytorch/attention/dot_product_attention/dot_product_attention.py`
and `utils.check_set_window_size`, TE 2.8-2.20), computed with torch on CPU.

Modelled (TE's checks, as read from its `forward`):
- the mask type and window chosen at construction are kept (`attn_mask_type`, `window_size` =
  `check_set_window_size(attn_mask_type, window_size)`); a call's `attn_mask_type`/`window_size` override them, and a
  window that does not fit the call's mask type is corrected with TE's warning ("window_size should be (-1, 0) ...");
  `window_warnings` counts those corrections so a test can see the phase switch left none;
- sbhd/bshd take 4-D q/k/v; thd takes 3-D [t, h, d] with a mask type containing "padding", `cu_seqlens_q` and
  `cu_seqlens_kv` both 1-D of the same shape and dtype int32 (else TE's assertion message);
- `max_seqlen_q/kv` for thd: a host int. (TE also takes None and then reads the lengths from the device with
  `.item()`; megatron passes the ints of `PackedSeqParams`, which is what our one-host-sync-per-step promise needs:
  anything else is refused here.)
- heads: q [.., h, d], k/v [.., g, d] with h divisible by g (GQA) and g the groups of this tensor-parallel
  partition (`num_gqa_groups // tp_size`, TE's assertion), output [.., h·d] flattened as TE returns it;
- megatron's `packed_seq_params` keywords (`pad_between_seqs` included, TE >= 2.2) and an `_extra_state` entry
  (empty: no FP8), as TE's module base gives every module.
Computed: softmax(q·kᵀ·scale) v per segment (thd) or per row, causal = top-left triangle, in fp32, cast back.
Not modelled: dropout (megatron's attention_dropout is 0 here), FP8 attention, context parallelism, KV caches,
attention bias, bottom-right diagonals, padded cu_seqlens, backend selection and its numerics.
"""
from __future__ import annotations

import math
import warnings

import torch

from transformer_engine.pytorch.module.base import FP8ExtraState

MASK_TYPES = {"no_mask", "padding", "causal", "padding_causal", "causal_bottom_right",
              "padding_causal_bottom_right", "arbitrary"}
window_warnings = []  # (layer, message) of every window TE would have corrected with a warning


def check_set_window_size(attn_mask_type: str, window_size=None):
    """TE's rule: causal types take (-1, 0) or (>=0, 0); no_mask/padding/arbitrary (-1, -1) or (>=0, >=0); a
    (-1, -1) under a causal type becomes (-1, 0) and vice versa, with a warning."""
    if "causal" in attn_mask_type:
        if window_size is None:
            return (-1, 0)
        if tuple(window_size) == (-1, -1) or (window_size[0] >= 0 and window_size[1] != 0):
            message = "window_size should be (-1, 0) or (>=0, 0) for attn_mask_type=" + attn_mask_type
            window_warnings.append(message)
            warnings.warn(message)
            return (window_size[0], 0)
        return tuple(window_size)
    if window_size is None:
        return (-1, -1)
    if tuple(window_size) == (-1, 0):
        message = "window_size should be (-1, -1) or (>=0, >=0) for attn_mask_type=" + attn_mask_type
        window_warnings.append(message)
        warnings.warn(message)
        return (-1, -1)
    return tuple(window_size)


def _attend(q, k, v, causal: bool, scale: float, window) -> torch.Tensor:
    """[s, h, d] x [s, g, d] -> [s, h, d]."""
    heads, groups = q.shape[1], k.shape[1]
    if heads % groups:
        raise AssertionError(f"num heads {heads} not divisible by num_gqa_groups {groups}")
    k = k.repeat_interleave(heads // groups, dim=1)
    v = v.repeat_interleave(heads // groups, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    sq, sk = scores.shape[-2:]
    row = torch.arange(sq).unsqueeze(1)
    col = torch.arange(sk).unsqueeze(0)
    blocked = torch.zeros(sq, sk, dtype=torch.bool)
    if causal:
        blocked |= col > row
    if window[0] >= 0:
        blocked |= col < row - window[0]
    if window[1] >= 0 and not causal:
        blocked |= col > row + window[1]
    scores = scores.masked_fill(blocked, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v.float()).to(q.dtype)


class DotProductAttention(FP8ExtraState, torch.nn.Module):
    def __init__(self, num_attention_heads: int, kv_channels, num_gqa_groups=None, attention_dropout: float = 0.0,
                 qkv_format: str = "sbhd", attn_mask_type: str = "causal", window_size=None,
                 sequence_parallel: bool = False, tp_size: int = 1, get_rng_state_tracker=None, tp_group=None,
                 layer_number=None, attention_type: str = "self", softmax_scale=None, **unmodelled):
        super().__init__()
        if attention_dropout:
            raise NotImplementedError("the DotProductAttention stand-in models no dropout")
        for name, value in unmodelled.items():
            if name not in ("cp_group", "cp_global_ranks", "cp_stream", "cp_comm_type", "bottom_right_diagonal",
                            "softmax_type", "return_max_logit", "name", "num_splits") or value not in (None, False,
                                                                                                       "p2p", "vanilla"):
                raise NotImplementedError(f"the DotProductAttention stand-in does not model {name}={value!r}")
        attn_mask_type = attn_mask_type.replace(",", "_")
        self.attn_mask_type = "padding_causal" if attn_mask_type == "causal_padding" else attn_mask_type
        self.window_size = check_set_window_size(self.attn_mask_type, window_size)
        self.qkv_format = qkv_format
        head_dim = kv_channels if isinstance(kv_channels, int) else kv_channels[0]
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
        self.layer_number = layer_number
        self.heads_per_partition = num_attention_heads // tp_size
        self.groups_per_partition = (num_gqa_groups or num_attention_heads) // tp_size
        self.fp8_meta = {"fp8_checkpoint": False}  # TE's modules carry an `_extra_state` entry (empty: no FP8)

    def forward(self, query_layer, key_layer, value_layer, attention_mask=None, qkv_format=None,
                cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None,
                max_seqlen_q=None, max_seqlen_kv=None, attn_mask_type=None, window_size=None,
                core_attention_bias_type="no_bias", core_attention_bias=None, pad_between_seqs=None,
                **unmodelled):
        if unmodelled or core_attention_bias is not None or cu_seqlens_q_padded is not None or pad_between_seqs:
            raise NotImplementedError(f"the DotProductAttention stand-in does not model {sorted(unmodelled)}")
        if attention_mask is not None:
            raise NotImplementedError("the DotProductAttention stand-in models no explicit attention_mask")
        if attn_mask_type is None:
            attn_mask_type = self.attn_mask_type
        attn_mask_type = attn_mask_type.replace(",", "_")
        assert attn_mask_type in MASK_TYPES, f"Attention mask type {attn_mask_type} is not supported!"
        window = check_set_window_size(attn_mask_type, self.window_size if window_size is None else window_size)
        qkv_format = qkv_format or self.qkv_format
        assert qkv_format in ("sbhd", "bshd", "thd"), \
            "DotProductAttention only supports qkv_format = {'sbhd', 'bshd', 'thd'}!"
        causal = "causal" in attn_mask_type
        if key_layer.shape[-2] != self.groups_per_partition:  # TE's check (per tensor-parallel partition)
            raise AssertionError(f"Keys and values must have num_gqa_group = {self.groups_per_partition} heads! "
                                 f"Found {key_layer.shape[-2]}.")
        if qkv_format == "thd":
            return self._thd(query_layer, key_layer, value_layer, attn_mask_type, causal, window,
                             cu_seqlens_q, cu_seqlens_kv, max_seqlen_q, max_seqlen_kv)
        assert all(x.dim() == 4 for x in (query_layer, key_layer, value_layer)), \
            f"Queries, keys and values must be 4D tensors when qkv_format={qkv_format!r}!"
        if "padding" in attn_mask_type:
            raise NotImplementedError("the stand-in models padding masks only in the thd format")
        seq_first = qkv_format == "sbhd"
        q, k, v = ((x.transpose(0, 1) if seq_first else x) for x in (query_layer, key_layer, value_layer))
        out = torch.stack([_attend(q[b], k[b], v[b], causal, self.softmax_scale, window) for b in range(q.shape[0])])
        out = out.transpose(0, 1) if seq_first else out
        return out.reshape(*out.shape[:2], -1)

    def _thd(self, q, k, v, attn_mask_type, causal, window, cu_q, cu_kv, max_q, max_kv):
        assert all(x.dim() == 3 for x in (q, k, v)), "Queries, keys and values must be 3D tensors when qkv_format = thd!"
        assert "padding" in attn_mask_type, \
            "Attention mask type must be padding or padding_causal for qkv_format=thd!"
        assert cu_q is not None and cu_kv is not None, \
            "cu_seqlens_q and cu_seqlens_kv can not be None when qkv_format = thd!"
        assert cu_q.shape == cu_kv.shape and cu_q.dim() == 1, \
            "cu_seqlens_q and cu_seqlens_q must both have shape [batch_size + 1]!"
        assert cu_q.dtype == torch.int32 and cu_kv.dtype == torch.int32, \
            "cu_seqlens_q and cu_seqlens_q must both be in dtype torch.int32!"
        for name, value in (("max_seqlen_q", max_q), ("max_seqlen_kv", max_kv)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be a host int (a tensor or None makes TE read the device), "
                                f"got {type(value).__name__}")
        bounds = cu_q.tolist()  # the stand-in may read them: it is not the thing being timed
        if bounds[-1] != q.shape[0] or max(b - a for a, b in zip(bounds, bounds[1:])) > max_q:
            raise AssertionError(f"cu_seqlens {bounds} do not fit {q.shape[0]} tokens / max_seqlen {max_q}")
        out = torch.cat([_attend(q[a:b], k[a:b], v[a:b], causal, self.softmax_scale, window)
                         for a, b in zip(bounds, bounds[1:])])
        return out.reshape(out.shape[0], -1)
