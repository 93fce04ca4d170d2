"""The learning-rate curve `build_scheduler` gives through megatron's OptimizerParamScheduler (WSD above all).

Convention (megatron's, and the trainer's: `train_step` steps the scheduler after each successful update): the
update of step k uses the LR after k-1 scheduler steps; the LR after all `total_steps` steps is the curve's end.
The expected curves are written from their definitions here, not read from megatron.
"""
import math

import pytest
import torch

from mlmclm.train.optim import OptimizerConfig, ScheduleConfig
from mlmclm.train.schedule_restarts import build_scheduler

LR, MIN_LR = 1e-3, 1e-5
SHAPES = {  # WSD decay coefficient at fraction x ∈ [0, 1] of the decay: 1 → max_lr, 0 → min_lr
    "linear": lambda x: 1 - x,
    "cosine": lambda x: (1 + math.cos(math.pi * x)) / 2,
    "exponential": lambda x: 2 * 0.5 ** x - 1,
    "minus_sqrt": lambda x: 1 - math.sqrt(x),
}


def curve(schedule: ScheduleConfig, total_steps: int, min_lr: float = MIN_LR):
    """(LR used by updates 1..total_steps, LR at the end of the run), from the real scheduler on a real optimizer."""
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    scheduler = build_scheduler(optimizer, OptimizerConfig(lr=LR, min_lr=min_lr), schedule, total_steps)
    used = []
    for _ in range(total_steps):
        used.append(optimizer.param_groups[0]["lr"])
        scheduler.step(increment=1)
    return used, optimizer.param_groups[0]["lr"]


def expected_wsd(total: int, warmup: int, decay: int, shape: str, min_lr: float = MIN_LR) -> list[float]:
    """LR after n scheduler steps, n = 0..total: linear warmup from 0, plateau at LR, `decay` steps of decay."""
    lrs = []
    for n in range(total + 1):
        if warmup and n <= warmup:
            lrs.append(LR * n / warmup)
        elif n <= total - decay:
            lrs.append(LR)
        else:
            lrs.append(min_lr + (LR - min_lr) * SHAPES[shape]((n - (total - decay)) / decay))
    return lrs


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_wsd_warmup_plateau_and_decay_to_min_lr(shape):
    total, warmup = 200, 20
    used, end = curve(ScheduleConfig(style="wsd", warmup_steps=warmup, decay_shape=shape), total)
    want = expected_wsd(total, warmup, decay=20, shape=shape)  # default decay: 10 % of the run
    assert used == pytest.approx(want[:-1], rel=1e-12, abs=1e-15) and end == pytest.approx(want[-1], abs=1e-15)
    # The pieces, read off the curve: warmup 0 → LR in 20 steps, a plateau at LR, 20 decaying steps to min_lr.
    assert used[0] == 0.0 and used[warmup] == LR and all(b > a for a, b in zip(used[:warmup], used[1:warmup + 1]))
    assert set(used[warmup:total - 20 + 1]) == {LR}
    decay = used[total - 20:] + [end]
    assert all(b < a for a, b in zip(decay, decay[1:])) and end == pytest.approx(MIN_LR, abs=1e-15)
    assert min(used) >= 0 and min(used[warmup:]) > MIN_LR
    # The shapes differ where they should: halfway through the decay.
    half = (used[total - 10] - MIN_LR) / (LR - MIN_LR)
    assert half == pytest.approx(SHAPES[shape](0.5))


@pytest.mark.parametrize("total, decay_steps, expected_decay", [(250, None, 25), (7, None, 1), (100, 40, 40)])
def test_wsd_decay_length_defaults_to_a_tenth_of_the_run(total, decay_steps, expected_decay):
    # With D decay steps, D - 1 updates use a decayed LR (the curve reaches min_lr as the run ends): a run shorter
    # than 20 steps has a 1-step decay that no update sees.
    used, end = curve(ScheduleConfig(style="wsd", decay_steps=decay_steps), total, min_lr=0.0)
    assert used == pytest.approx(expected_wsd(total, 0, expected_decay, "linear", 0.0)[:-1], rel=1e-12)
    assert used.count(LR) == total - expected_decay + 1 and end == 0.0


def test_wsd_without_decay_stays_on_the_plateau():
    # decay_steps=0: a WSD run that keeps its stable LR to the end (to be decayed later from its checkpoint).
    used, end = curve(ScheduleConfig(style="wsd", warmup_steps=5, decay_steps=0), 50)
    assert used[5:] == [LR] * 45 and end == LR


def test_other_styles_decay_over_the_whole_run_after_warmup():
    total, warmup = 100, 10
    for style, f in (("cosine", SHAPES["cosine"]), ("linear", SHAPES["linear"]), ("constant", lambda x: 1.0)):
        used, end = curve(ScheduleConfig(style=style, warmup_steps=warmup), total)
        want = [LR * n / warmup if n <= warmup else MIN_LR + (LR - MIN_LR) * f((n - warmup) / (total - warmup))
                for n in range(total + 1)]
        if style == "constant":
            want = [LR * n / warmup if n <= warmup else LR for n in range(total + 1)]
        assert used + [end] == pytest.approx(want, rel=1e-12, abs=1e-15), style


def test_resumed_scheduler_continues_the_same_curve():
    schedule, total = ScheduleConfig(style="wsd", warmup_steps=10, decay_shape="cosine"), 100
    full, _ = curve(schedule, total)
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    first = build_scheduler(optimizer, OptimizerConfig(lr=LR, min_lr=MIN_LR), schedule, total)
    first.step(increment=95)  # mid-decay
    resumed_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    resumed = build_scheduler(resumed_opt, OptimizerConfig(lr=LR, min_lr=MIN_LR), schedule, total)
    resumed.load_state_dict(first.state_dict())
    after = []
    for _ in range(5):
        after.append(resumed_opt.param_groups[0]["lr"])
        resumed.step(increment=1)
    assert after == full[95:]


def test_schedule_that_does_not_fit_the_run_is_refused():
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    with pytest.raises(ValueError, match="warmup 15 \\+ decay 10 exceed the run's 20 steps"):
        build_scheduler(optimizer, OptimizerConfig(), ScheduleConfig(warmup_steps=15, decay_steps=10), 20)
    with pytest.raises(ValueError, match="warmup_steps 20 must be < total steps 20"):
        build_scheduler(optimizer, OptimizerConfig(), ScheduleConfig(style="cosine", warmup_steps=20), 20)
