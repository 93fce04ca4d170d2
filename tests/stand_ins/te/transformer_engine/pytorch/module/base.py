"""The FP8 extra state of TE's modules (`TransformerEngineBaseModule.get_extra_state` / `set_extra_state` in
`transformer_engine/pytorch/module/base.py`), on CPU, by TE version (`transformer_engine.__version__`, read at each
call; `transformer_engine.set_version` switches it):

- TE 2.2-2.17 (read at v2.2 and v2.17): a module with FP8 checkpoint state (`fp8_checkpoint`) writes a pickled dict
  for **every** recipe: `recipe` (the recipe object), for delayed scaling also `scale_fwd`, `amax_history_fwd`,
  `scale_bwd`, `amax_history_bwd` (CPU tensors), and `extra_fp8_variables` (every plain value of `fp8_meta`),
  serialised into a uint8 tensor. `set_extra_state` unpickles any non-empty payload with no gate.
- TE >= 2.18 (read at 2.18 and 2.20's development head): stateless recipes (current scaling, MXFP8, block
  scaling) write an empty tensor; `set_extra_state` puts a byte payload through
  `_extra_state.should_load_extra_state_pickle` before `pickle.loads` (a delayed-scaling payload is refused unless
  NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1), a BytesIO is unsafe unless opted in.
Both: an empty payload is skipped; anything but a tensor or BytesIO is "Unsupported checkpoint format."; a payload
without `recipe` (TE 1.x) gets `DelayedScaling()`; the loaded `extra_fp8_variables` update `fp8_meta`, the recipe
replaces it, the delayed tensors are copied. Not modelled: FP8 itself (the amax history is never updated here),
`init_fp8_meta_tensors`, device copies.

`get_dummy_wgrad` (TE >= 2.8, read at 2.8 and 2.20): one reusable tensor per (shape, dtype), zero-filled on
request — megatron's fused linears and TE's own hand it to autograd instead of a weight gradient. Made on CUDA as
TE makes it, on the CPU where there is none (the one deviation).

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

import transformer_engine
from transformer_engine.common.recipe import DelayedScaling, Float8BlockScaling, Float8CurrentScaling, MXFP8BlockScaling
from transformer_engine.pytorch.distributed import get_distributed_world_size
from transformer_engine.pytorch._extra_state import (extra_state_pickle_advisory, should_load_extra_state_pickle,
                                                     unsafe_pickle_extra_state_enabled)

RECIPES = {"delayed": DelayedScaling, "tensorwise": Float8CurrentScaling, "mxfp8": MXFP8BlockScaling,
           "blockwise": Float8BlockScaling}
DELAYED_KEYS = ("scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd")
_dummy_wgrads: dict = {}


def refuses_unsafe_pickles() -> bool:
    """TE >= 2.18's extra-state rules (else 2.2-2.17's)."""
    from packaging.version import Version

    return Version(transformer_engine.__version__).release[:2] >= (2, 18)


def get_workspace() -> torch.Tensor:
    """TE's cuBLAS workspace (a 32 MiB uint8 buffer on the GPU, made once): a token here, `general_gemm` ignores it."""
    return torch.empty(0, dtype=torch.uint8)


def get_dummy_wgrad(shape: list, dtype: torch.dtype, zero: bool = False) -> torch.Tensor:
    key = (*shape, dtype)
    if key not in _dummy_wgrads:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        _dummy_wgrads[key] = torch.empty(shape, dtype=dtype, device=device, requires_grad=False)
    if zero:
        _dummy_wgrads[key].fill_(0)
    return _dummy_wgrads[key].detach()


class FP8ExtraState:
    """Mix into a torch module: `fp8_meta` is what the checkpoint carries."""

    def init_fp8_meta(self, delayed: bool = True, amax_history_len: int = 4, seed: float = 1.0,
                      recipe: str | None = None) -> None:
        """FP8 checkpoint state as a run with `recipe` leaves it (`delayed=True`: delayed scaling with an amax
        history; `delayed=False` and no recipe: no FP8 state)."""
        name = recipe or ("delayed" if delayed else None)
        made = DelayedScaling(amax_history_len=amax_history_len) if name in (None, "delayed") else RECIPES[name]()
        self.fp8_meta = {"fp8_checkpoint": name is not None, "num_gemms": 1, "recipe": made}
        if name == "delayed":
            self.fp8_meta.update(
                scale_fwd=torch.full((3,), seed), amax_history_fwd=torch.arange(3.0 * amax_history_len).reshape(-1, 3),
                scale_bwd=torch.full((2,), seed / 2), amax_history_bwd=torch.ones(amax_history_len, 2) * seed)

    def get_extra_state(self) -> torch.Tensor:
        meta = getattr(self, "fp8_meta", None)
        if not meta or not meta.get("fp8_checkpoint"):
            return torch.empty(0, dtype=torch.uint8)
        recipe = meta["recipe"]
        if refuses_unsafe_pickles() and not recipe.delayed():  # 2.18: stateless recipes store nothing
            return torch.empty(0, dtype=torch.uint8)
        state = {"recipe": recipe}
        if recipe.delayed():
            for key in DELAYED_KEYS:
                state[key] = meta[key].clone()
        state["extra_fp8_variables"] = {k: v for k, v in meta.items() if k != "buffer_index_and_autocast_key"
                                        and isinstance(v, (bool, int, float, str, tuple, list))}
        return torch.frombuffer(bytearray(pickle.dumps(state)), dtype=torch.uint8)

    def set_extra_state(self, state) -> None:
        if state is None:
            return
        context = type(self).__name__
        gated = refuses_unsafe_pickles()
        if isinstance(state, torch.Tensor):
            if state.numel() == 0:
                return
            data = state.detach().cpu().numpy().tobytes()
            if gated and not should_load_extra_state_pickle(data, context):
                return
            state = pickle.loads(data)
        elif isinstance(state, io.BytesIO):
            if gated and not unsafe_pickle_extra_state_enabled():
                raise RuntimeError(extra_state_pickle_advisory(context))
            state.seek(0)
            state = torch.load(state, map_location="cpu", weights_only=False)
        else:
            raise RuntimeError("Unsupported checkpoint format.")
        if state is None:
            return
        if "recipe" not in state:  # TE 1.x
            state["recipe"] = DelayedScaling()
        meta = getattr(self, "fp8_meta", None) or {}
        meta.update(state["extra_fp8_variables"])
        meta["recipe"] = state["recipe"]
        if state["recipe"].delayed():
            meta.update({k: state[k] for k in DELAYED_KEYS})
        self.fp8_meta = meta


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
