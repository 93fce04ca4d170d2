"""The FP8 extra state of TE's modules (`TransformerEngineBaseModule.get_extra_state` / `set_extra_state` in
`transformer_engine/pytorch/module/base.py`, TE 2.18-2.20), on CPU.

Modelled: the payload's shape — empty for a module without FP8 checkpoint state or with a stateless recipe; for
delayed scaling a pickled dict of `recipe`, `scale_fwd`, `amax_history_fwd`, `scale_bwd`, `amax_history_bwd` (CPU
tensors) and `extra_fp8_variables` (plain values), serialised into a uint8 tensor — and `set_extra_state`'s gate:
an empty payload is skipped, a byte payload goes through `_extra_state.should_load_extra_state_pickle` before
`pickle.loads` (so a delayed-scaling payload is refused unless NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1), a BytesIO is
unsafe unless opted in, anything else is "Unsupported checkpoint format". Not modelled: FP8 itself (the amax
history is never updated here), `init_fp8_meta_tensors`, the TE 1.x fix-ups, device copies.

`TransformerEngineBaseModule` is the part of TE's module base that its linears share, as read from TE 2.20's
`module/base.py`: the tensor-parallel group (`set_tensor_parallel_group`; a forward with `tp_size > 1` and no group
is refused with TE's message), parameter registration with an init function run under the RNG tracker's fork
(`register_parameter` + `reset_parameters`: `fork(rng_tracker_name)` when set, else `fork()`), the dtype rule of
`set_activation_dtype` (outside autocast an input whose dtype differs from a parameter's is refused with TE's
TypeError) and the `_extra_state` entry above (empty without FP8). Not modelled: TE's refusal without CUDA
("TransformerEngine needs CUDA."), which is the one rule a CPU stand-in must break; FP8 metadata, debug hooks,
FSDP, CPU offload, weight workspaces.
"""
from __future__ import annotations

import io
import pickle

import torch

from transformer_engine.common.recipe import DelayedScaling
from transformer_engine.pytorch.distributed import get_distributed_world_size
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


class TransformerEngineBaseModule(FP8ExtraState, torch.nn.Module):
    def __init__(self, name: str | None = None) -> None:
        super().__init__()
        self.name = name
        self.fp8 = False
        self.fp8_meta = {"fp8_checkpoint": False, "fp8_group": None}
        self.tp_group = None
        self.tp_group_initialized = False
        self.tp_size = 1
        self.sequence_parallel = False
        self.param_init_meta = {}
        self.activation_dtype = None
        self.rng_tracker_name = None

    def set_tensor_parallel_group(self, tp_group) -> None:
        self.tp_group = tp_group
        self.tp_group_initialized = True

    def _set_tp(self, tp_group, tp_size: int) -> None:
        """TE's constructor rule: a given group decides the size; without one, tp_size (group set later)."""
        if tp_group is None:
            self.tp_size = tp_size
            if tp_size == 1:
                self.set_tensor_parallel_group(tp_group)
        else:
            self.tp_size = get_distributed_world_size(tp_group)
            self.set_tensor_parallel_group(tp_group)

    def register_parameter(self, name, param, init_fn=None, get_rng_state_tracker=None, **unused):
        super().register_parameter(name, param)
        if param is not None and name not in self.param_init_meta:
            self.param_init_meta[name] = (init_fn, get_rng_state_tracker)

    def reset_parameters(self, defer_init: bool = False) -> None:
        if defer_init:
            return
        for name, param in self.named_parameters(recurse=False):
            init_fn, tracker = self.param_init_meta[name]
            init_fn = init_fn or (lambda w: torch.nn.init.normal_(w, mean=0.0, std=0.023))
            if tracker is None:
                init_fn(param)
            else:
                with (tracker().fork(self.rng_tracker_name) if self.rng_tracker_name else tracker().fork()):
                    init_fn(param)
            setattr(self, name, torch.nn.Parameter(param))

    def prepare_forward(self, inp: torch.Tensor) -> torch.Tensor:
        if self.tp_size > 1 and not self.tp_group_initialized:
            raise RuntimeError("Tensor parallel group not initialized. Call set_tensor_parallel_group() before "
                               "forward pass when tp_size > 1.")
        if torch.is_autocast_enabled():
            raise NotImplementedError("the TE stand-in models no torch.autocast region")
        if self.activation_dtype != inp.dtype:
            for name, param in self.named_parameters():
                if inp.dtype != param.dtype:
                    raise TypeError("Data types for parameters must match when outside of autocasted region. "
                                    f"Found input dtype: {inp.dtype} and {name!r} dtype: {param.dtype}")
            self.activation_dtype = inp.dtype
        return inp.contiguous()
