"""A CPU stand-in for Transformer Engine's FusedAdam, the optimizer megatron-core builds on every GPU image with TE.

TE's optimizer cannot run here (its kernels are CUDA-only), and torch's AdamW — what CPU runs get — keeps its state
differently, which is how a resume bug reached an H200 unseen. The stand-in enforces what TE 2.x's
`transformer_engine/pytorch/optimizers/fused_adam.py` and its kernel (`common/multi_tensor/adam.cu`) do to state
(read from those sources; nothing copied):
- the step count lives in each parameter *group* as a Python int (`group["step"]`: set to 1 at the first step,
  then incremented), and the update kernel takes it as a C `int`: a float (or a float tensor) there is a TypeError
  at the next step, as pybind11 raises for TE's `multi_tensor_adam(..., const int step, ...)`;
- per-parameter state holds only `exp_avg`, `exp_avg_sq` and (with master weights) `master_param`: `state_dict`
  and `load_state_dict` look every entry up in that name → dtype table, so any other entry — torch Adam's
  per-parameter `step` — raises `KeyError` with its name;
- `load_state_dict` rebuilds each parameter's state from the loaded entries cast to fp32 (`.float()`);
- the update is the kernel's AdamW (adam_w_mode=1) in fp32: m, v updated; update = (m / bc1) / (sqrt(v / bc2) + eps)
  + weight_decay * p; p -= lr * update, with bc1 = 1 - beta1^step, bc2 = 1 - beta2^step. It is not torch's AdamW
  order of operations, so a resume across the two agrees to rounding, not bit for bit.
Not modelled: capturable mode, fp16/bf16/fp8 moments, master weights inside the optimizer (megatron's
precision-aware optimizer, which mlmclm refuses) and param remainders; asking for them raises.

`fused_adam_standin()` switches it in where megatron-core 0.19 decides at import that TE's optimizer is there.
"""
from __future__ import annotations

import contextlib
import importlib
import operator

import torch

STATE_NAMES = ("exp_avg", "exp_avg_sq", "master_param")  # TE's name_to_dtype_map: the only per-parameter entries


def _check_state_name(name: str) -> None:
    if name not in STATE_NAMES:
        raise KeyError(name)  # what TE's lookup of an unknown name raises: KeyError: 'step'


def _kernel_step(step) -> int:
    """The step as the CUDA kernel's `const int` argument accepts it (pybind11: ints and __index__, never floats)."""
    try:
        return operator.index(step)
    except TypeError:
        raise TypeError(f"multi_tensor_adam(): incompatible function arguments: step must be an int, got "
                        f"{type(step).__name__} {step!r} (param_groups['step'])") from None


class FusedAdamStandIn(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
                 bias_correction=True, adam_w_mode=True, capturable=False, master_weights=False, **other):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        if capturable or master_weights or other:
            raise NotImplementedError("the FusedAdam stand-in models neither capturable mode, master weights, "
                                      f"nor {sorted(other)}")
        defaults = {"lr": lr, "bias_correction": bias_correction, "betas": betas, "eps": eps,
                    "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.adam_w_mode = bool(adam_w_mode)

    def state_dict(self):
        state_dict = super().state_dict()
        for entries in state_dict["state"].values():
            for name in entries:
                _check_state_name(name)
        return state_dict

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        params = [p for group in self.param_groups for p in group["params"]]
        for index, entries in state_dict["state"].items():
            param = params[index]
            self.state[param] = {}
            for name, value in entries.items():
                if value is None:
                    continue
                _check_state_name(name)
                self.state[param][name] = torch.empty_like(param, dtype=torch.float32).copy_(value.float())

    @torch.no_grad()
    def step(self, closure=None, grad_scaler=None):
        if grad_scaler is not None:
            raise NotImplementedError("the FusedAdam stand-in has no grad-scaler path")
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            if not group["params"]:
                continue  # TE leaves the step of an empty group alone (megatron re-aligns them)
            group["step"] = group["step"] + 1 if "step" in group else 1
            step = _kernel_step(group["step"])
            beta1, beta2 = group["betas"]
            bc1 = 1 - beta1 ** step if group["bias_correction"] else 1.0
            bc2 = 1 - beta2 ** step if group["bias_correction"] else 1.0
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if not state:
                    state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
                self._update(param, state, group, bc1, bc2)
        return loss

    def _update(self, param, state, group, bc1: float, bc2: float) -> None:
        beta1, beta2 = group["betas"]
        decay, value = group["weight_decay"], param.float()
        grad = param.grad.float()
        if not self.adam_w_mode:  # L2 mode: the decay goes into the gradient
            grad = grad + decay * value
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        update = (exp_avg / bc1) / ((exp_avg_sq / bc2).sqrt() + group["eps"])
        if self.adam_w_mode:
            update.add_(value, alpha=decay)
        param.copy_(value - group["lr"] * update)


# Where megatron-core 0.19 records its choice: both modules try `from transformer_engine.pytorch.optimizers import
# FusedAdam as Adam` at import and set these flags when it succeeds (`get_megatron_optimizer` then passes
# `adam_w_mode`; the distributed optimizer keeps the step in the param groups, as an int, in its state dict).
MEGATRON_TE_CHOICE = {
    "megatron.core.optimizer": {"USING_PYTORCH_OPTIMIZER": False},
    "megatron.core.optimizer.distrib_optimizer": {"HAVE_APEX_OR_TE": True, "USING_TE_OPTIMIZER": True,
                                                  "USING_APEX_OPTIMIZER": False},
}


@contextlib.contextmanager
def fused_adam_standin():
    """Inside, megatron builds and checkpoints the stand-in exactly as it would TE's FusedAdam."""
    saved = {}
    for name, flags in MEGATRON_TE_CHOICE.items():
        module = importlib.import_module(name)
        saved[module] = {key: getattr(module, key) for key in (*flags, "Adam")}
        for key, value in {**flags, "Adam": FusedAdamStandIn}.items():
            setattr(module, key, value)
    try:
        yield
    finally:
        for module, values in saved.items():
            for key, value in values.items():
                setattr(module, key, value)
