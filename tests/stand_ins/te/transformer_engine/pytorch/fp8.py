"""TE's FP8 global state (`transformer_engine/pytorch/fp8.py`, in TE 2.x a re-export of `quantization.py`): the
names megatron imports when TE is present (`FP8GlobalStateManager`, `fp8_autocast`, `fp8_model_init`).

Modelled: FP8 off — what megatron reads when its config has no `fp8` (`is_fp8_enabled()` and
`with_fp8_parameters()` are False, `fp8_autocast(enabled=False)` and `fp8_model_init(enabled=False)` change
nothing). Not modelled: FP8 itself; asking for it is refused (NotImplementedError), never silently ignored.
"""
from __future__ import annotations

import contextlib


class FP8GlobalStateManager:
    """Only the state of a run without FP8."""

    @classmethod
    def is_fp8_enabled(cls) -> bool:
        return False

    @classmethod
    def is_fp8_calibration(cls) -> bool:
        return False

    @classmethod
    def with_fp8_parameters(cls) -> bool:
        return False

    @classmethod
    def with_high_precision_init_val(cls) -> bool:
        return False

    @classmethod
    def fp8_graph_capturing(cls) -> bool:
        return False

    @classmethod
    def is_first_fp8_module(cls) -> bool:
        return False

    @classmethod
    def get_fp8_recipe(cls):
        raise NotImplementedError("the TE stand-in models no FP8: there is no active recipe")


@contextlib.contextmanager
def fp8_autocast(enabled: bool = True, calibrating: bool = False, fp8_recipe=None, fp8_group=None, **kwargs):
    if enabled or calibrating:
        raise NotImplementedError("the TE stand-in models no FP8 (fp8_autocast(enabled=True))")
    yield


@contextlib.contextmanager
def fp8_model_init(enabled: bool = True, recipe=None, **kwargs):
    if enabled:
        raise NotImplementedError("the TE stand-in models no FP8 parameters (fp8_model_init(enabled=True))")
    yield


autocast = fp8_autocast
quantized_model_init = fp8_model_init
