"""Where the Adam step lives when a checkpoint is loaded: torch's AdamW (our CPU path) keeps it per parameter,
TE's and apex's FusedAdam (GPU) in the parameter groups, as an int. A checkpoint saved with one is loaded with the
other (a CPU run resumed on a GPU, a GPU image without TE); these adapt megatron's loading to either.
"""
from __future__ import annotations

import torch


def keeps_step_per_parameter(torch_optimizer) -> bool:
    """Whether the Adam step count lives in each parameter's state: torch's Adam/AdamW (our CPU path) yes; TE's and
    apex's FusedAdam (GPU) keep it in the parameter groups, and TE's `state_dict` fails on a per-parameter `step`."""
    return type(torch_optimizer).__module__.startswith("torch.optim")


def keep_step_when_loading(inner) -> None:
    """megatron 0.19's distributed optimizer, with torch's Adam (no TE/apex: our CPU path), restores the Adam step
    count globally but then expects it among each parameter's saved tensors too, and fails. Hand it the value it
    has already restored. Instance-level and only where the step lives in per-parameter state."""
    setter = getattr(inner, "_set_main_param_and_optimizer_states", None)
    if setter is None or getattr(setter, "_keeps_step", False):
        return

    def set_states(model_param, tensors):
        group, order = inner.model_param_group_index_map[model_param]
        step = inner.optimizer.state[inner.optimizer.param_groups[group]["params"][order]].get("step")
        if isinstance(step, torch.Tensor) and "step" not in tensors:
            tensors = {**tensors, "step": step.clone()}
        return setter(model_param, tensors)

    set_states._keeps_step = True
    inner._set_main_param_and_optimizer_states = set_states


def fit_groups_to_fused_adam(torch_optimizer) -> None:
    """Make parameter groups loaded from a torch-AdamW checkpoint (CPU, or a GPU image without TE) usable by TE's or
    apex's FusedAdam, which megatron builds where TE/apex import. megatron restores the saved groups as they were:
    - the Adam step: FusedAdam keeps it in each group as an int (TE's kernel takes a C int and raises a TypeError
      for anything else); torch's is stored there as a float, 3.0 (megatron reads it from torch's per-parameter
      step tensors). Cast; a fractional or negative step comes from no Adam and is refused;
    - FusedAdam's own hyperparameters (`bias_correction`), which torch's groups lack: its step reads them, so a
      missing one raises KeyError. Taken from this optimizer's defaults, as a group added to it would be.
    A step that is no whole number is refused (ValueError)."""
    for group in torch_optimizer.param_groups:
        for key, value in torch_optimizer.defaults.items():
            group.setdefault(key, value)
        step = group.get("step")
        if step is None or (isinstance(step, int) and not isinstance(step, bool)):
            continue
        value = float(step)
        if not value.is_integer() or value < 0:
            raise ValueError(f"the optimizer's Adam step {step!r} is not a whole number")
        group["step"] = int(value)
