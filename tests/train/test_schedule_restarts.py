"""The CLM detour's schedule as published: a warmup given in tokens, a constant phase 1, then a phase that restarts
the schedule with a 1-√ cooldown while AdamW's state carries on (PhaseConfig.restart_schedule).

The LR sequences are written from their definitions here; the optimizer test runs megatron's distributed optimizer
on a tiny ModernBERT and compares AdamW's moments and step counts across the switch with a run whose schedule does
not restart (same weights up to the switch, so the same gradients)."""
import math

import pytest
import torch

from mlmclm.parallel.launch import spawn
from mlmclm.train.optim import OptimizerConfig, ScheduleConfig
from mlmclm.train.schedule_restarts import build_scheduler

PEAK, FLOOR = 2e-4, 2e-5
PHASE1, PHASE2 = 8, 4
OPT = OptimizerConfig(lr=PEAK, min_lr=FLOOR)
PUBLISHED = dict(schedule=ScheduleConfig(style="constant", warmup_tokens=10), restart=ScheduleConfig(
    style="cooldown", decay_shape="minus_sqrt"))


def lrs(optimizer, scheduler, steps: int) -> list[float]:
    used = []
    for _ in range(steps):
        used.append(optimizer.param_groups[0]["lr"])
        scheduler.step(increment=1)
    return used + [optimizer.param_groups[0]["lr"]]


def test_cooldown_decays_as_one_minus_sqrt_to_the_floor():
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    span = 16
    got = lrs(optimizer, build_scheduler(optimizer, OPT, ScheduleConfig(style="cooldown", decay_shape="minus_sqrt"),
                                         span), span)
    assert got == pytest.approx([FLOOR + (PEAK - FLOOR) * (1 - math.sqrt(k / span)) for k in range(span + 1)],
                                rel=1e-12)
    assert got[0] == PEAK and got[-1] == pytest.approx(FLOOR)


def test_phase_switch_restarts_the_schedule_from_the_peak():
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    # 10 warmup tokens at 4 tokens a step: 3 warmup steps (rounded up), then constant; at step 8 the cooldown
    scheduler = build_scheduler(optimizer, OPT, PUBLISHED["schedule"], PHASE1 + PHASE2,
                                restarts=[(PHASE1, PUBLISHED["restart"])], tokens_per_step=4)
    got = lrs(optimizer, scheduler, PHASE1 + PHASE2)
    want = [PEAK * k / 3 for k in range(3)] + [PEAK] * (PHASE1 - 3) + \
        [FLOOR + (PEAK - FLOOR) * (1 - math.sqrt(k / PHASE2)) for k in range(PHASE2 + 1)]
    assert got == pytest.approx(want, rel=1e-12)
    # resumed mid-cooldown (megatron's state dict: the step count), the curve goes on
    again_opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))])
    again = build_scheduler(again_opt, OPT, PUBLISHED["schedule"], PHASE1 + PHASE2,
                            restarts=[(PHASE1, PUBLISHED["restart"])], tokens_per_step=4)
    again.load_state_dict({**scheduler.state_dict(), "num_steps": PHASE1 + 1})
    assert lrs(again_opt, again, PHASE2 - 1) == pytest.approx(want[PHASE1 + 1:], rel=1e-12)


def test_the_phase_plan_option_is_validated():
    from mlmclm.model import preset
    from mlmclm.objectives import ObjectiveConfig
    from mlmclm.train.config import DataConfig, PhaseConfig, TrainConfig

    def config(phases, **schedule):
        return TrainConfig(run_dir="/tmp/unused", model=preset("tiny-modernbert"), data=DataConfig(path="/tmp/x"),
                           phases=phases, total_steps=12, global_batch_size=4, schedule=ScheduleConfig(**schedule))

    clm, mlm = ObjectiveConfig("clm"), ObjectiveConfig("mlm", mask_ratio=0.15)
    cooldown = ScheduleConfig(style="cooldown", decay_shape="minus_sqrt")
    cfg = TrainConfig.from_dict({"run_dir": "/tmp/unused", "model": "tiny-modernbert", "data": {"path": "/tmp/x"},
                                 "total_steps": 12, "global_batch_size": 4,
                                 "schedule": {"style": "constant", "warmup_tokens": 100},
                                 "phases": [{"objective": {"kind": "clm"}, "steps": 8},
                                            {"objective": {"kind": "mlm", "mask_ratio": 0.15}, "steps": 4,
                                             "restart_schedule": {"style": "cooldown", "decay_shape": "minus_sqrt"}}]})
    assert cfg.schedule_spans() == [(0, cfg.schedule), (8, cooldown)]
    with pytest.raises(ValueError, match="phases\\[0\\].restart_schedule: the first phase starts the run's schedule"):
        config([PhaseConfig(clm, steps=8, restart_schedule=cooldown), PhaseConfig(mlm, steps=4)])
    with pytest.raises(ValueError, match="warmup_steps 8 must be < total steps 8"):  # the first span ends at step 8
        config([PhaseConfig(clm, steps=8), PhaseConfig(mlm, steps=4, restart_schedule=cooldown)], style="cosine",
               warmup_steps=8)
    with pytest.raises(ValueError, match="not both"):
        ScheduleConfig(warmup_steps=2, warmup_tokens=100)


def _optimizer_state(optimizer) -> dict:
    """AdamW's per-parameter state (moments, step) of every inner optimizer, copied."""
    out = {}
    for i, inner in enumerate(getattr(optimizer, "chained_optimizers", [optimizer])):
        for j, state in enumerate(inner.optimizer.state.values()):
            out.update({(i, j, key): torch.as_tensor(value).clone() for key, value in state.items()})
    return out


def _switch_worker(out: str) -> None:
    from mlmclm.convert.modernbert_config import model_config_from_modernbert
    from mlmclm.model import build_model, set_causal
    from mlmclm.objectives import ObjectiveConfig, build_objective
    from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel
    from mlmclm.train.optim import build_optimizer, wrap_ddp
    from mlmclm.train.step import configure_model_for_schedules, train_step
    from tests.model.modernbert_fixtures import SEQ, hf_modernbert_config

    model = model_config_from_modernbert(hf_modernbert_config(), "tiny", make_vocab_divisible_by=64).model
    tokens = torch.randint(4, model.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(0))
    clm, mlm = (build_objective(ObjectiveConfig(kind, mask_ratio=0.15), special_token_ids=[0, 1, 2, 3],
                                mask_token_id=2, vocab_size=model.vocab_size, seed=1) for kind in ("clm", "mlm"))
    opt = OptimizerConfig(lr=1e-2, min_lr=1e-3, beta2=0.98, eps=1e-6, weight_decay=1e-5,
                          decoupled_weight_decay=True)
    results = {}
    for name, restarts in (("restart", [(3, PUBLISHED["restart"])]), ("no_restart", [])):
        init_parallel(ParallelConfig(), seed=7)
        chunks = build_model(model, ParallelConfig(), causal=True, use_te=False)
        ddp = wrap_ddp(chunks, distributed_optimizer=True)
        optimizer = build_optimizer(ddp, opt)
        scheduler = build_scheduler(optimizer, opt, ScheduleConfig(style="constant"), 6, restarts=restarts)
        configure_model_for_schedules(ddp, optimizer)
        states, used = [], []
        for step in range(6):
            objective = clm if step < 3 else mlm
            set_causal(chunks, objective.causal)  # the phase switch at step 3, as pretrain makes it
            used.append(optimizer.param_groups[0]["lr"])
            train_step(ddp, optimizer, scheduler, [objective.prepare(tokens, torch.arange(2))])
            states.append(_optimizer_state(optimizer))
        results[name] = {"states": states, "lrs": used}
        destroy_parallel()
    torch.save(results, out)


def test_the_switch_keeps_adams_moments_and_step_count(tmp_path):
    spawn(_switch_worker, 1, str(tmp_path / "r.pt"))
    r = torch.load(tmp_path / "r.pt", weights_only=False)
    restart, plain = r["restart"], r["no_restart"]
    # the schedules: both constant at the peak through the first update of phase 2, then the cooldown falls
    assert restart["lrs"][:4] == pytest.approx(plain["lrs"][:4], rel=1e-12) and plain["lrs"] == [1e-2] * 6
    assert restart["lrs"][4] < restart["lrs"][3] * 0.9
    # the update at the switch (step 4, the phase's first) sees the moments the CLM phase left: the same state as
    # without a restart, step count 4, not a fresh optimizer's 1
    for step in range(4):
        assert restart["states"][step].keys() == plain["states"][step].keys()
        assert all(torch.equal(restart["states"][step][k], plain["states"][step][k]) for k in plain["states"][step])
    steps = {v.item() for k, v in restart["states"][3].items() if k[2] == "step"}
    assert steps == {4.0}
    # the moments go on from there (different LRs make the weights, then the moments, differ afterwards)
    moments = [k for k in restart["states"][3] if k[2] == "exp_avg"]
    assert any(not torch.equal(restart["states"][5][k], plain["states"][5][k]) for k in moments)


def test_decoupled_weight_decay_follows_the_schedule_not_the_peak():
    # Composer's DecoupledAdamW (ModernBERT's trainer): w <- w (1 - wd × lr / peak); torch's AdamW: w (1 - lr × wd')
    opt = OptimizerConfig(lr=PEAK, min_lr=FLOOR, weight_decay=1e-5, decoupled_weight_decay=True)
    assert opt.torch_weight_decay == pytest.approx(1e-5 / PEAK)
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weight])
    scheduler = build_scheduler(optimizer, opt, ScheduleConfig(style="cooldown", decay_shape="minus_sqrt"), 4)
    for _ in range(2):  # zero gradients: AdamW's update is the decay alone
        lr, before = optimizer.param_groups[0]["lr"], weight.detach().clone()
        weight.grad = torch.zeros(3)
        optimizer.step()
        scheduler.step(increment=1)
        assert torch.allclose(weight.detach(), before * (1 - 1e-5 * lr / PEAK), rtol=0, atol=1e-12)
