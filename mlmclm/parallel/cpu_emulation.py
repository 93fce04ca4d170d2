"""Run megatron-core's real code paths on CPU over gloo by emulating the few CUDA calls it makes.

Switched on only when CUDA is absent (development machines, CI). What it changes, and why:
1. `torch.cuda.current_device()` returns the CPU device: megatron allocates parameters and buffers with
   `device=torch.cuda.current_device()`.
2. The model-parallel RNG tracker keeps *CPU* generator states: megatron's tracker saves and restores CUDA RNG
   states when it forks (weight init of sharded layers, dropout in TP regions).
3. A `TorchFunctionMode` maps `device="cuda"` (factory functions, `.to`) to the CPU, makes `Tensor.cuda()` a
   no-op, and answers `Tensor.type()` with `torch.cuda.*` names, which megatron's optimizer and DDP compare against.
4. `torch.cuda.synchronize()` is a no-op, and `torch.cuda.current_stream()` returns a stream whose waits are
   no-ops: CPU work is synchronous, so there is nothing to wait for (megatron's gradient sync asks for the stream).
On a machine with CUDA none of this is installed and megatron runs unchanged.
"""
from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

_CPU = torch.device("cpu")
_installed = False
_mode: TorchFunctionMode | None = None


def _is_cuda_device(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)




class _CudaAsCpuMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type:
            if len(args) == 1 and "dtype" not in kwargs:
                # torch's name is e.g. "torch.FloatTensor"; CUDA tensors report "torch.cuda.FloatTensor".
                return func(args[0]).replace("torch.", "torch.cuda.", 1)
            target = args[1] if len(args) > 1 else kwargs.pop("dtype")
            if isinstance(target, str):
                target = target.replace("torch.cuda.", "torch.", 1)
            return func(args[0], target, **kwargs)
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs["device"] = _CPU
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], _CPU, *args[2:])
        return func(*args, **kwargs)


class _SynchronousStream:
    """Stands in for a CUDA stream: every operation on the CPU has already completed."""

    def wait_event(self, event) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event=None):
        return event


def _install_cpu_rng_tracker() -> None:
    from megatron.core.tensor_parallel import random as mp_random

    class CpuRNGStatesTracker(mp_random.CudaRNGStatesTracker):
        """megatron's tracker with CPU generator states in place of CUDA ones."""

        def add(self, name, seed):
            self._is_initialized = True
            if seed in self.seeds_:
                raise ValueError(f"seed {seed} already exists")
            if name in self.states_:
                raise ValueError(f"rng state {name} already exists")
            self.seeds_.add(seed)
            original = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(original)

        @contextlib.contextmanager
        def fork(self, name=mp_random._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise KeyError(f"rng state {name} is not added")
            original = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(original)

    mp_random._CUDA_RNG_STATE_TRACKER = CpuRNGStatesTracker()
    mp_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


def install() -> bool:
    """Install the emulation if CUDA is absent. Idempotent; returns whether the emulation is active."""
    global _installed, _mode
    if torch.cuda.is_available():
        return False
    if _installed:
        return True
    torch.cuda.current_device = lambda: _CPU
    torch.cuda.synchronize = lambda *args, **kwargs: None
    stream = _SynchronousStream()
    torch.cuda.current_stream = lambda *args, **kwargs: stream
    torch.cuda.default_stream = lambda *args, **kwargs: stream
    _install_cpu_rng_tracker()
    _mode = _CudaAsCpuMode()
    _mode.__enter__()
    _installed = True
    return True


def is_active() -> bool:
    return _installed
