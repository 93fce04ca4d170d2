"""The run's learning-rate scheduler (`build_scheduler`): megatron's, or one that phases restart while the
optimizer's state carries on.

The CLM detour's second phase (recipes/detour.py) keeps AdamW's moments and step count from the first and restarts
only the scheduler: a new curve (a 1-√ cooldown) from the phase's first step. `RestartedSchedule` is megatron's
`OptimizerParamScheduler` for the run — the same step counter, state dict and checkpoint — whose learning rate at
step n is that of the span holding n: span k starts at its phase's first step and runs to the next restart (or the
run's end) on its own curve, as a scheduler built for that span alone would give it at step n − start. Nothing
touches the optimizer at a restart: its moments are the ones the last step left.

The first span's curve is the run's `schedule` and fills the state dict's plan fields (megatron checks them on
resume as for any run); the later spans come from the config that builds the scheduler, as every span's plan does.
"""
from __future__ import annotations

from types import SimpleNamespace

from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from mlmclm.train.optim import OptimizerConfig, ScheduleConfig, scheduler_for_span


class RestartedSchedule(OptimizerParamScheduler):
    def __init__(self, optimizer, opt: OptimizerConfig, restarts: list[tuple[int, ScheduleConfig]], total_steps: int,
                 tokens_per_step: float | None = None):
        starts = [start for start, _ in restarts]
        if starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])) or starts[-1] >= total_steps:
            raise ValueError(f"schedule restarts at steps {starts[1:]} must rise strictly inside the run's "
                             f"{total_steps} steps")
        ends = [*starts[1:], total_steps]
        # Each span's own curve, computed on a stand-in optimizer (no parameter group: setting nothing).
        self.spans = [(start, scheduler_for_span(SimpleNamespace(param_groups=[]), opt, sched.in_steps(tokens_per_step),
                                                 end - start))
                      for (start, sched), end in zip(restarts, ends)]
        first = self.spans[0][1]
        super().__init__(optimizer, init_lr=first.init_lr, max_lr=first.max_lr, min_lr=first.min_lr,
                         lr_warmup_steps=first.lr_warmup_steps, lr_decay_steps=first.lr_decay_steps,
                         lr_decay_style=first.lr_decay_style, start_wd=first.start_wd, end_wd=first.end_wd,
                         wd_incr_steps=first.wd_incr_steps, wd_incr_style=first.wd_incr_style,
                         wsd_decay_steps=first.wsd_decay_steps, lr_wsd_decay_style=first.lr_wsd_decay_style)

    def span_at(self, step: int) -> tuple[int, OptimizerParamScheduler]:
        """(its first step, its curve) of the span holding `step`."""
        return next((start, curve) for start, curve in reversed(self.spans) if start <= step)

    def get_lr(self, param_group: dict) -> float:
        start, curve = self.span_at(self.num_steps)
        curve.num_steps = self.num_steps - start
        return curve.get_lr(param_group)


def build_scheduler(optimizer, opt: OptimizerConfig, sched: ScheduleConfig, total_steps: int,
                    restarts=(), tokens_per_step: float | None = None) -> OptimizerParamScheduler:
    """megatron's scheduler over the run; with `restarts` — (step, ScheduleConfig) where phases restart it —
    `RestartedSchedule`, one curve per span. `tokens_per_step` makes warmups given in tokens steps. Here, not in
    mlmclm.train.optim, which RestartedSchedule imports (no import circle)."""
    if restarts:
        return RestartedSchedule(optimizer, opt, [(0, sched), *restarts], total_steps, tokens_per_step)
    return scheduler_for_span(optimizer, opt, sched.in_steps(tokens_per_step), total_steps)
