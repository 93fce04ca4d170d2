"""Counter-based random numbers: splitmix64 in int64 torch ops.

Every random number is a pure function of (seed, sample index, position, stream), so a sample draws the same
randoms on CPU and GPU, on any parallel layout and after a restart, with no generator state to carry.
int64 arithmetic wraps modulo 2**64 on CPU and CUDA, which is exactly splitmix64's uint64 arithmetic; right
shifts are made logical with a mask.
"""
from __future__ import annotations

import torch

_U64 = 1 << 64


def _s64(value: int) -> int:
    """A uint64 constant as the int64 with the same bits."""
    value %= _U64
    return value - _U64 if value >= 1 << 63 else value


_GOLDEN = _s64(0x9E3779B97F4A7C15)
_M1 = _s64(0xBF58476D1CE4E5B9)
_M2 = _s64(0x94D049BB133111EB)


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's output function of the counter `x` (int64 tensor in, int64 tensor out, same bits as uint64)."""
    z = x + _GOLDEN
    z = (z ^ _shr(z, 30)) * _M1
    z = (z ^ _shr(z, 27)) * _M2
    return z ^ _shr(z, 31)


def splitmix64_reference(x: int) -> int:
    """Pure-Python uint64 reference, for tests."""
    z = (x + 0x9E3779B97F4A7C15) % _U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % _U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % _U64
    return z ^ (z >> 31)


def token_randoms(seed: int, sample_ids: torch.Tensor, seq_len: int, stream: int) -> torch.Tensor:
    """Non-negative int64 randoms, uniform on [0, 2**53), shape [b, seq_len], for each (sample, position).

    `stream` separates independent draws for the same token (e.g. "select" vs "how to corrupt").
    """
    positions = torch.arange(seq_len, dtype=torch.int64, device=sample_ids.device)
    return randoms_at(seed, sample_ids[:, None], positions[None, :], stream)


def randoms_at(seed: int, sample_ids: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """`token_randoms` for explicit (sample, position) pairs (broadcast together): a token draws the same number
    whether its sample fills a row from column 0 or lies among others laid end to end."""
    device = sample_ids.device
    key = splitmix64(torch.tensor(_s64(seed), dtype=torch.int64, device=device) + _s64(stream * 0x632BE59BD9B4E019))
    per_sample = splitmix64(key ^ sample_ids.to(torch.int64))
    counters = per_sample + positions.to(torch.int64) * _GOLDEN                     # distinct per position
    return _shr(splitmix64(counters), 11)


UNIT = 1 << 53  # token_randoms are uniform on [0, UNIT)


def threshold(probability: float) -> int:
    """The integer t with P(token_randoms < t) == probability (to 2**-53)."""
    return int(round(probability * UNIT))
