"""The optimizer's and the learning-rate schedule's settings (mlmclm.train.optim builds them on megatron-core);
apart from it so that reading a config imports neither torch nor megatron-core."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal


@dataclass
class OptimizerConfig:
    """AdamW with the paper's defaults."""

    lr: float = 5e-4
    min_lr: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-5
    weight_decay: float = 0.1
    # How `weight_decay` is read. False: torch's AdamW (each step multiplies the weights by 1 - lr × weight_decay).
    # True: "decoupled" AdamW as Composer's DecoupledAdamW (ModernBERT's trainer) applies it, 1 - weight_decay ×
    # lr / peak lr — the decay follows the schedule's shape but not the peak's size; run as torch's AdamW with
    # weight_decay / lr (`torch_weight_decay`), the same update.
    decoupled_weight_decay: bool = False
    clip_grad: float = 1.0
    distributed_optimizer: bool = True  # shard optimizer state over data-parallel ranks
    # Reduce each gradient bucket while backward still runs (megatron DDP `overlap_grad_reduce`); on in NVIDIA's
    # Megatron-Bridge Llama recipes (`llama32_1b`: overlap_grad_reduce=True). Same values, only earlier.
    overlap_grad_reduce: bool = True
    # With the distributed optimizer: all-gather the updated parameters bucket by bucket during the next forward
    # (megatron DDP `overlap_param_gather`) instead of all at once after the update; on in Megatron-Bridge's
    # Llama recipes (`llama32_1b`: overlap_param_gather=True). Between a step and the next forward the model's
    # parameters are then stale, so every save first forces the gather (`params_in_sync`). Ignored without the
    # distributed optimizer.
    overlap_param_gather: bool = True

    def __post_init__(self):
        # Each check is written so that NaN fails it (NaN compares false to everything), and infinities are refused
        # by name: lr=Infinity trained into all-NaN checkpoints
        for name in ("lr", "min_lr", "beta1", "beta2", "eps", "weight_decay", "clip_grad"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"optimizer.{name} must be a finite number, got {value!r}")
        if not (self.lr > 0 and 0 <= self.min_lr <= self.lr):
            raise ValueError(f"optimizer: need 0 <= min_lr <= lr and lr > 0, got lr={self.lr} min_lr={self.min_lr}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"optimizer: betas must be in [0, 1), got {self.beta1}, {self.beta2}")
        if not isinstance(self.decoupled_weight_decay, bool):
            raise ValueError(f"optimizer.decoupled_weight_decay must be true or false, got "
                             f"{self.decoupled_weight_decay!r}")
        if not (self.clip_grad >= 0 and self.weight_decay >= 0 and self.eps > 0):
            raise ValueError(f"optimizer: clip_grad and weight_decay must be >= 0 and eps > 0, got clip_grad="
                             f"{self.clip_grad} weight_decay={self.weight_decay} eps={self.eps}")


    @property
    def torch_weight_decay(self) -> float:
        """The weight decay torch's AdamW is given (see `decoupled_weight_decay`)."""
        return self.weight_decay / self.lr if self.decoupled_weight_decay else self.weight_decay


STYLES = ("wsd", "cosine", "linear", "constant", "cooldown")


@dataclass
class ScheduleConfig:
    """Learning rate over the whole run (all phases), or from a phase that restarts it (`PhaseConfig
    .restart_schedule`) to the next restart or the run's end. WSD: warmup, stable, then `decay_steps` of decay.
    cooldown: after any warmup, the whole span decays from lr to min_lr in `decay_shape` (the CLM detour's MLM
    phase: a 1-√ cooldown, `decay_shape: minus_sqrt`)."""

    style: Literal["wsd", "cosine", "linear", "constant", "cooldown"] = "wsd"
    warmup_steps: int = 0
    decay_steps: int | None = None  # WSD: length of the final decay; default 10 % of the run
    decay_shape: Literal["linear", "cosine", "exponential", "minus_sqrt"] = "linear"  # WSD / cooldown decay shape
    # The warmup given in tokens (the CLM detour's 100M): made steps when the run starts, from its tokens per step
    # (global batch × row length; random-length samples: their mean length), rounded up. Excludes warmup_steps.
    warmup_tokens: int | None = None

    def __post_init__(self):
        if self.style not in STYLES:
            raise ValueError(f"schedule.style must be one of {', '.join(STYLES)}, got {self.style!r}")
        if self.warmup_steps < 0 or (self.decay_steps is not None and self.decay_steps < 0):
            raise ValueError("schedule: warmup_steps and decay_steps must be >= 0")
        if self.warmup_tokens is not None and (isinstance(self.warmup_tokens, bool) or
                                               not isinstance(self.warmup_tokens, int) or self.warmup_tokens < 1):
            raise ValueError(f"schedule.warmup_tokens must be an integer >= 1 or null, got {self.warmup_tokens!r}")
        if self.warmup_tokens is not None and self.warmup_steps:
            raise ValueError("schedule: give the warmup in steps (warmup_steps) or in tokens (warmup_tokens), not both")
        if self.style == "cooldown" and self.decay_steps is not None:
            raise ValueError("schedule.decay_steps is for wsd: a cooldown decays over its whole span")

    def in_steps(self, tokens_per_step: float | None) -> "ScheduleConfig":
        """This schedule with a warmup given in tokens made steps (rounded up), at `tokens_per_step`."""
        if self.warmup_tokens is None:
            return self
        if not tokens_per_step or tokens_per_step <= 0:
            raise ValueError("schedule.warmup_tokens needs the run's tokens per step")
        return replace(self, warmup_tokens=None, warmup_steps=math.ceil(self.warmup_tokens / tokens_per_step))

    def decay_for(self, total_steps: int) -> int:
        """WSD's decay length in a run of `total_steps`: as configured, else 10 % of the run; a cooldown's: all of
        it after the warmup."""
        if self.style == "cooldown":
            return total_steps - self.warmup_steps
        return self.decay_steps if self.decay_steps is not None else max(1, total_steps // 10)

    def check(self, total_steps: int) -> None:
        """Raise if warmup (and WSD's decay) do not fit in a run of `total_steps`."""
        if self.style != "constant" and total_steps > 0 and self.warmup_steps >= total_steps:
            raise ValueError(f"schedule.warmup_steps {self.warmup_steps} must be < total steps {total_steps}")
        decay = self.decay_for(total_steps)
        if self.style == "wsd" and self.warmup_steps + decay > total_steps:
            raise ValueError(f"schedule: warmup {self.warmup_steps} + decay {decay} exceed the run's "
                             f"{total_steps} steps")
