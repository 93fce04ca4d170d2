"""Where a fine-tuning run computes: `--device auto|cpu|cuda`, and moving host batches there.

EncodEval runs every configuration with `device: cuda`; ours follows the machine (`auto`): the GPU when there is
one. The model, its heads, every batch and the retrieval encodes go on that device; batches are collated on the
host (a thread ahead of the device, prefetch.py), pinned when the device is a GPU, and copied without a host wait.
The device is where a run computed, not what it is: it is left out of the run's fingerprint and written in its
record (`extra.device`), so a grid begun on CPUs is finished, not redone, on GPUs.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mlmclm.parallel.runtime import on_gpu, to_device

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(choice: str) -> str:
    """`auto` -> "cuda" when a GPU is visible, else "cpu"; `cuda` without one is refused in one line (ValueError:
    the command's refusal, exit 2)."""
    if choice not in DEVICE_CHOICES:
        raise ValueError(f"--device must be one of {', '.join(DEVICE_CHOICES)}, got {choice!r}")
    if choice == "cpu":
        return "cpu"
    if on_gpu():
        return "cuda"
    if choice == "cuda":
        raise ValueError("--device cuda: no CUDA device is visible here (torch.cuda.is_available() is False); "
                         "use --device auto or cpu")
    return "cpu"


def check_device(device: str) -> None:
    """A device string torch reads ("cpu", "cuda", "cuda:1", "meta" in tests), refused otherwise."""
    try:
        torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be a torch device such as 'cpu' or 'cuda', got {device!r} ({err})") from None


def on_device(value: Any, device: str) -> Any:
    """Tensors in `value` (through mappings, tuples and lists) on `device`; from the host to a GPU pinned and
    non-blocking (runtime.to_device), so the copy is queued behind the device's work instead of waiting for it."""
    if isinstance(value, torch.Tensor):
        return value if value.device == torch.device(device) else to_device(value, torch.device(device))
    if isinstance(value, Mapping):
        return type(value)({key: on_device(item, device) for key, item in value.items()})
    if isinstance(value, (tuple, list)):
        return type(value)(on_device(item, device) for item in value)
    return value


def pinned(value: Any) -> Any:
    """Host tensors in page-locked memory (done by the prefetch thread, so that the device's copy need not)."""
    if isinstance(value, torch.Tensor):
        return value.pin_memory() if value.device.type == "cpu" else value
    if isinstance(value, Mapping):
        return type(value)({key: pinned(item) for key, item in value.items()})
    if isinstance(value, (tuple, list)):
        return type(value)(pinned(item) for item in value)
    return value
