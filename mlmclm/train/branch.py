"""Branches: a run that starts from another run's checkpoint with its *full* state, then follows its own plan.

The paper's biphasic models continue CLM checkpoints that have not been decayed, and under a warmup-stable-decay
schedule the first `total − decay` steps of a 12k, 22k or 42k run are the same steps. So a biphasic run (CLM for s
steps, then MLM) is the 42k CLM run up to step s, then its own phases and decay: a branch at step s. Unlike
`checkpoint.init_from` (weights only: fresh optimizer, schedule and data position, for continued pretraining), a
branch restores weights, optimizer state, scheduler position, data position and RNG, so that it equals the one-job
run bit for bit.

A branch is refused, naming the field, when anything that shapes the steps before the branch point differs from the
parent's: what a resume refuses (seeds, data, batch, model, optimizer, warmup, peak LR, precision …) and the phases
before the branch step. What may differ is what a resume may always change, plus the plan from the branch step on:
`total_steps`, the phases after it and `schedule.decay_steps` — as long as neither run's LR decay starts before the
branch step (the stable phase is the same in both only before either decays).
"""
from __future__ import annotations

import copy
from dataclasses import asdict
from pathlib import Path

from mlmclm.data.manifest import Manifest
from mlmclm.train import checkpoint_files as ckpt
from mlmclm.train.resume_check import (FREE_ON_RESUME, IncompatibleCheckpointError, _covered, changed_fields,
                                       check_same_data_identity)

# Where a branch's own plan lives; compared separately (phases, decay) or free (the run's length).
PLAN_FIELDS = ("total_steps", "phases", "schedule.decay_steps")
# The scheduler fields a branch keeps from its own config (the parent's step count is restored, its plan is not).
_SCHEDULE_PLAN = ("max_lr", "min_lr", "lr_warmup_steps", "lr_decay_steps", "lr_decay_style", "start_wd", "end_wd",
                  "wd_incr_steps", "wd_incr_style")


class BranchError(IncompatibleCheckpointError):
    pass


def branch_source(branch_from: str, step: int) -> Path:
    """The parent's checkpoint at `step`: `branch_from` is the parent's run directory, its checkpoints directory or
    the `iter_*` directory itself."""
    path = Path(branch_from)
    candidates = [path] if path.name.startswith("iter_") else [ckpt.iteration_dir(path / "checkpoints", step),
                                                               ckpt.iteration_dir(path, step)]
    for candidate in candidates:
        if ckpt.is_complete(candidate):
            return candidate
    raise BranchError(f"checkpoint.branch_from={branch_from}: no complete checkpoint of step {step} there (looked "
                      f"for {', '.join(str(c) for c in candidates)}); the parent must save and keep it "
                      f"(checkpoint.keep_steps)")


def _without_plan(config: dict) -> dict:
    stripped = copy.deepcopy(config)
    stripped.pop("total_steps", None)
    stripped.pop("phases", None)
    stripped.get("schedule", {}).pop("decay_steps", None)
    return stripped


def _phases_before(config, step: int) -> list[tuple[int, int, dict]]:
    """(start, end clipped at `step`, objective) of every phase that starts before `step`."""
    return [(start, min(end, step), asdict(config.phases[i].objective))
            for i, (start, end) in enumerate(config.phase_bounds()) if start < step]


def _data_identity(data) -> dict:
    """What makes a phase's samples (the locations aside: data may move, as on resume)."""
    return {"seed": data.seed, "random_length": asdict(data.random_length) if data.random_length else None,
            "blend_weights": sorted((data.blend or {}).values())}


def _decay_start(config) -> int | None:
    """The first step whose LR depends on the run's length: WSD's decay start; 0 for cosine/linear (their LR at
    every step depends on the length); None for constant."""
    style = config.schedule.style
    if style == "wsd":
        return config.total_steps - config.schedule.decay_for(config.total_steps)
    return None if style == "constant" else 0


def check_branch(parent_config: dict, parent_state: dict, child, manifest: Manifest, where: str) -> None:
    """Refuse (BranchError naming the field) a branch whose steps before the branch point would differ."""
    from mlmclm.train.config import TrainConfig

    step = child.checkpoint.branch_step
    if parent_state.get("iteration") != step:
        raise BranchError(f"{where}: holds step {parent_state.get('iteration')}, not checkpoint.branch_step {step}")
    check_same_data_identity(parent_state, manifest, where)
    check_branch_plan(TrainConfig.from_dict(parent_config), child, step, where)


def check_branch_plan(parent, child, step: int, where: str) -> None:
    """The configs part of `check_branch` (also what the sweep checks when it plans a grid): the two runs are the
    same run up to `step`."""
    for field, (old, new) in changed_fields(_without_plan(parent.to_dict()), _without_plan(child.to_dict())).items():
        if not _covered(field, FREE_ON_RESUME):
            raise BranchError(f"{where}: {field} is {old!r} in the parent but {new!r} here; the steps before the "
                              f"branch point would not be the parent's")
    mine, theirs = _phases_before(child, step), _phases_before(parent, step)
    for index in range(max(len(mine), len(theirs))):
        a = theirs[index] if index < len(theirs) else None
        b = mine[index] if index < len(mine) else None
        if a is None or b is None or a[:2] != b[:2]:
            raise BranchError(f"{where}: phases.{index}: the phases before the branch step {step} differ from the "
                              f"parent's (parent: {[t[:2] for t in theirs]}, here: {[m[:2] for m in mine]})")
        for key in sorted(a[2].keys() | b[2].keys()):
            if a[2].get(key) != b[2].get(key):
                raise BranchError(f"{where}: phases.{index}.objective.{key} is {a[2].get(key)!r} in the parent but "
                                  f"{b[2].get(key)!r} here, before the branch step {step}")
    from mlmclm.train.config import PHASE_MODEL_FIELDS

    (_, parent_sources), (_, child_sources) = parent.data_streams(), child.data_streams()
    parent_data, child_data = parent.phase_data(), child.phase_data()
    parent_models, child_models = parent.phase_models(), child.phase_models()
    for index in range(len(mine)):
        a, b = _data_identity(parent_data[index]), _data_identity(child_data[index])
        if a != b or parent_sources[index] != child_sources[index]:
            raise BranchError(f"{where}: phases.{index}.data: the phase reads {a} in the parent but {b} here, "
                              f"before the branch step {step}")
        for name in PHASE_MODEL_FIELDS:
            a, b = getattr(parent_models[index], name), getattr(child_models[index], name)
            if a != b:
                raise BranchError(f"{where}: phases.{index}.{name}: {a!r} in force in the parent but {b!r} here, "
                                  f"before the branch step {step}")
    for who, config in (("the parent's", parent), ("this config's", child)):
        start = _decay_start(config)
        if start is not None and start < step:
            field = "schedule.decay_steps" if config.schedule.style == "wsd" else "total_steps"
            raise BranchError(f"{where}: {field}: {who} learning rate depends on the run's length from step {start}, "
                              f"before the branch step {step} ({config.schedule.style} schedule, {config.total_steps} "
                              f"steps); branch from the stable phase of a WSD schedule")


def follow_own_schedule(scheduler, own_plan: dict) -> None:
    """After loading the parent's scheduler state (its step count and its plan), put this run's plan back: the
    parent's step count, this run's warmup, peak, length and decay. `own_plan` is `scheduler.state_dict()` taken
    before the load."""
    steps = scheduler.num_steps
    for name in _SCHEDULE_PLAN:
        setattr(scheduler, name, own_plan[name])
    scheduler.num_steps = 0
    scheduler.step(increment=steps)
