"""TE's FP8 recipe classes (`transformer_engine/common/recipe/__init__.py`, TE 2.x): the same module path, class
names and fields a checkpoint's pickle refers to, as plain dataclasses. Modelled: what a pickled recipe imports and
holds. Not modelled: recipe behaviour (there are no FP8 kernels here)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple


class _FormatHelper(NamedTuple):
    max_fwd: float
    max_bwd: float


class Format(Enum):
    E4M3 = _FormatHelper(max_fwd=448, max_bwd=448)
    E5M2 = _FormatHelper(max_fwd=57344, max_bwd=57344)
    HYBRID = _FormatHelper(max_fwd=448, max_bwd=57344)


class Recipe:
    def delayed(self) -> bool:
        return isinstance(self, DelayedScaling)


@dataclass(repr=False)
class DelayedScaling(Recipe):
    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False


@dataclass(repr=False)
class Float8CurrentScaling(Recipe):
    fp8_format: Format = Format.HYBRID
    fp8_dpa: bool = False
    fp8_mha: bool = False


@dataclass(repr=False)
class MXFP8BlockScaling(Recipe):
    margin: int = 0
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False


@dataclass(repr=False)
class Float8BlockScaling(Recipe):
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False
