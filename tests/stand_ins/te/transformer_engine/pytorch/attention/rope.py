"""TE's `apply_rotary_pos_emb` (`transformer_engine/pytorch/attention/rope.py`, TE 2.3-2.20), the fused path megatron
calls for THD (`fused_apply_rotary_pos_emb_thd` → `apply_rotary_pos_emb(..., tensor_format="thd", fused=True,
cu_seqlens=...)`), computed with torch.

Modelled: THD needs `cu_seqlens` (TE: "cu_seqlens must not be None when tensor_format is 'thd'"), int32 and 1-D as
TE's kernel takes it; the positions restart at 0 in every segment (each segment rotated with freqs[0:len]); only
the first `freqs.shape[-1]` channels rotate, the rest pass through; cos/sin computed in fp32 then cast to t's
dtype; non-interleaved halves (rotate_half), or interleaved pairs. sbhd/bshd rotate every row from position 0.
(Attention within a segment depends only on the distance between positions, so positions running on across
segments would leave training losses unchanged; the restart is checked directly, tests/model/test_te_attention_rules.)
Not modelled: context parallelism (cp_size > 1 is refused), `start_positions`, the fused kernel's speed — and its
defining property, that it needs no host read: this stand-in reads the boundaries itself (`.tolist()`), which is
free on CPU; what the real kernel saves is counted on a GPU by `gpu_check`'s host-sync count.
"""
from __future__ import annotations

import torch


def _rotate_half(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if interleaved:
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack((-odd, even), dim=-1).flatten(-2)
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _rotate(t: torch.Tensor, freqs: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """t [s, ..., d], freqs [>= s, 1, 1, d2]: rotate the first d2 channels of row i by freqs[i]."""
    freqs = freqs[: t.shape[0]].reshape(t.shape[0], *([1] * (t.dim() - 2)), freqs.shape[-1]).float()
    cos, sin = torch.cos(freqs).to(t.dtype), torch.sin(freqs).to(t.dtype)
    rot = freqs.shape[-1]
    head, rest = t[..., :rot], t[..., rot:]
    return torch.cat((head * cos + _rotate_half(head, interleaved) * sin, rest), dim=-1)


def apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor, tensor_format: str = "sbhd",
                         start_positions=None, interleaved: bool = False, fused: bool = False,
                         cu_seqlens: torch.Tensor | None = None, cp_size: int = 1, cp_rank: int = 0) -> torch.Tensor:
    if start_positions is not None or cp_size != 1:
        raise NotImplementedError("the RoPE stand-in models neither start_positions nor context parallelism")
    if tensor_format == "thd":
        assert cu_seqlens is not None, "cu_seqlens must not be None when tensor_format is 'thd'."
        if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1:
            raise AssertionError(f"cu_seqlens must be 1-D int32, got {cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
        bounds = cu_seqlens.tolist()
        if bounds[-1] != t.shape[0]:
            raise AssertionError(f"cu_seqlens end at {bounds[-1]}, t has {t.shape[0]} tokens")
        return torch.cat([_rotate(t[a:b], freqs, interleaved) for a, b in zip(bounds, bounds[1:])])
    if tensor_format == "sbhd":
        return _rotate(t, freqs, interleaved)
    if tensor_format == "bshd":
        return _rotate(t.transpose(0, 1), freqs, interleaved).transpose(0, 1)
    raise ValueError(f"Unsupported tensor_format: {tensor_format}.")
