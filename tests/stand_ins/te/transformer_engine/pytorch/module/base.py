"""The FP8 extra state of TE's modules (`TransformerEngineBaseModule.get_extra_state` / `set_extra_state` in
`transformer_engine/pytorch/module/base.py`, TE 2.18-2.20), on CPU.

Modelled: the payload's shape — empty for a module without FP8 checkpoint state or with a stateless recipe; for
delayed scaling a pickled dict of `recipe`, `scale_fwd`, `amax_history_fwd`, `scale_bwd`, `amax_history_bwd` (CPU
tensors) and `extra_fp8_variables` (plain values), serialised into a uint8 tensor — and `set_extra_state`'s gate:
an empty payload is skipped, a byte payload goes through `_extra_state.should_load_extra_state_pickle` before
`pickle.loads` (so a delayed-scaling payload is refused unless NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1), a BytesIO is
unsafe unless opted in, anything else is "Unsupported checkpoint format". Not modelled: FP8 itself (the amax
history is never updated here), `init_fp8_meta_tensors`, the TE 1.x fix-ups, device copies.
"""
from __future__ import annotations

import io
import pickle

import torch

from transformer_engine.common.recipe import DelayedScaling
from transformer_engine.pytorch._extra_state import (extra_state_pickle_advisory, should_load_extra_state_pickle,
                                                     unsafe_pickle_extra_state_enabled)


class FP8ExtraState:
    """Mix into a torch module: `fp8_meta` is what the checkpoint carries."""

    def init_fp8_meta(self, delayed: bool, amax_history_len: int = 4, seed: float = 1.0) -> None:
        self.fp8_meta = {"fp8_checkpoint": delayed, "recipe": DelayedScaling(amax_history_len=amax_history_len)}
        if delayed:
            self.fp8_meta.update(
                scale_fwd=torch.full((3,), seed), amax_history_fwd=torch.arange(3.0 * amax_history_len).reshape(-1, 3),
                scale_bwd=torch.full((2,), seed / 2), amax_history_bwd=torch.ones(amax_history_len, 2) * seed)

    def get_extra_state(self) -> torch.Tensor:
        meta = getattr(self, "fp8_meta", None)
        if not meta or not meta.get("fp8_checkpoint") or not isinstance(meta["recipe"], DelayedScaling):
            return torch.empty(0, dtype=torch.uint8)
        state = {"recipe": meta["recipe"]}
        for key in ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd"):
            state[key] = meta[key].clone()
        state["extra_fp8_variables"] = {"fp8_checkpoint": True, "num_gemms": 1}
        return torch.frombuffer(bytearray(pickle.dumps(state)), dtype=torch.uint8)

    def set_extra_state(self, state) -> None:
        if state is None:
            return
        context = type(self).__name__
        if isinstance(state, torch.Tensor):
            if state.numel() == 0:
                return
            data = state.detach().cpu().numpy().tobytes()
            if not should_load_extra_state_pickle(data, context):
                return
            state = pickle.loads(data)
        elif isinstance(state, io.BytesIO):
            if not unsafe_pickle_extra_state_enabled():
                raise RuntimeError(extra_state_pickle_advisory(context))
            state.seek(0)
            state = torch.load(state, map_location="cpu", weights_only=False)
        else:
            raise RuntimeError("Unsupported checkpoint format.")
        if state is None:
            return
        self.fp8_meta = {"fp8_checkpoint": True, **state["extra_fp8_variables"], "recipe": state["recipe"],
                         **{k: state[k] for k in ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd")}}
