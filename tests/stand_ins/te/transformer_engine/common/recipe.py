"""TE's FP8 recipe classes (`transformer_engine/common/recipe/__init__.py`, read at TE 2.2 and at 2.20's development
head): the same module path, class names and fields a checkpoint's pickle refers to, built as TE builds them.

Modelled: the recipes are **pydantic dataclasses** (`pydantic.dataclasses.dataclass`, as in every TE 2.x), so
- keyword arguments a recipe has no field for are ignored, not refused — megatron-core 0.19 relies on it:
  `TEDelayedScaling` passes `override_linear_precision` and `_get_extra_te_kwargs`'s `params_dtype`/`device`
  (none of them a field of TE 2.2-2.20's DelayedScaling);
- fields are validated and coerced by type (a `margin` of "0" becomes 0, a `margin` of "a" raises pydantic's
  ValidationError, a ValueError);
- `__post_init__` refuses `Format.E5M2` ("Pure E5M2 training is not supported.", an assertion pydantic reports
  as its ValidationError);
- `MMParams`/`QParams` are frozen pydantic dataclasses; the current-scaling recipe's GEMM fields hold MMParams (so
  its pickle imports MMParams), its `fp8_quant_*` QParams are unannotated class attributes, as in TE (not pickled);
- the `Recipe` class tests `delayed()`, `float8_current_scaling()`, `mxfp8()`, `float8_block_scaling()`,
  `float8_per_tensor_scaling()`.
Not modelled: recipe behaviour (there are no FP8 kernels here), NVFP4 and custom recipes, the NVTE_* environment
defaults of newer fields (`backward_override`, power-of-2 scales), the cached repr.
"""
from __future__ import annotations

from enum import Enum
from typing import Callable, Literal, NamedTuple, Optional, Union

from pydantic.dataclasses import dataclass


class _FormatHelper(NamedTuple):
    max_fwd: float
    max_bwd: float


class Format(Enum):
    E4M3 = _FormatHelper(max_fwd=448, max_bwd=448)
    E5M2 = _FormatHelper(max_fwd=57344, max_bwd=57344)
    HYBRID = _FormatHelper(max_fwd=448, max_bwd=57344)


@dataclass(frozen=True)
class MMParams:
    use_split_accumulator: bool = True


@dataclass(frozen=True)
class QParams:
    power_2_scale: bool = False
    amax_epsilon: float = 0.0


class Recipe:
    @classmethod
    def delayed(cls) -> bool:
        return issubclass(cls, DelayedScaling)

    @classmethod
    def float8_current_scaling(cls) -> bool:
        return issubclass(cls, Float8CurrentScaling)

    @classmethod
    def float8_per_tensor_scaling(cls) -> bool:
        return issubclass(cls, (DelayedScaling, Float8CurrentScaling))

    @classmethod
    def mxfp8(cls) -> bool:
        return issubclass(cls, MXFP8BlockScaling)

    @classmethod
    def float8_block_scaling(cls) -> bool:
        return issubclass(cls, Float8BlockScaling)

    def _check_format(self) -> None:
        assert self.fp8_format != Format.E5M2, "Pure E5M2 training is not supported."


@dataclass(repr=False)
class DelayedScaling(Recipe):
    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: Union[Literal["max", "most_recent"], Callable] = "max"
    scaling_factor_compute_algo: Optional[Callable] = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self) -> None:
        self._check_format()


@dataclass(repr=False)
class Float8CurrentScaling(Recipe):
    fp8_format: Format = Format.HYBRID
    # Unannotated in TE: class attributes, not fields (not in an instance's pickle).
    fp8_quant_fwd_inp = QParams(power_2_scale=False, amax_epsilon=0.0)
    fp8_quant_fwd_weight = QParams(power_2_scale=False, amax_epsilon=0.0)
    fp8_quant_bwd_grad = QParams(power_2_scale=False, amax_epsilon=0.0)
    fp8_gemm_fprop: MMParams = MMParams(use_split_accumulator=False)
    fp8_gemm_dgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_gemm_wgrad: MMParams = MMParams(use_split_accumulator=True)
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self) -> None:
        self._check_format()


@dataclass(repr=False)
class MXFP8BlockScaling(Recipe):
    margin: int = 0
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self) -> None:
        self._check_format()


@dataclass(repr=False)
class Float8BlockScaling(Recipe):
    fp8_format: Format = Format.E4M3
    fp8_dpa: bool = False
    fp8_mha: bool = False

    def __post_init__(self) -> None:
        self._check_format()
