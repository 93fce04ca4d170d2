"""The experiment grids as data: every pretraining run of the paper (38 models), a scaled-down CPU grid with the
same structure (from-scratch runs, a biphasic run, a CPT run that depends on a decayed parent), and the
mini-replication's grid (the paper's design at CPU scale, per pretraining seed; recipes/mini.py runs it).

A `GridRun` names a registered recipe and its parameters; `after` names the run whose final (decayed) checkpoint
it continues, so the sweep launches it only when that run has finished; `branch_of` names the run whose stable-phase
checkpoint at `branch_step` it branches from (mlmclm.train.branch: the parent's full state, then its own plan), so
the sweep has the parent keep that checkpoint and starts the branch once it is written. `recipes/sweep.py` launches
a grid.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recipes import paper
from recipes.base import PAPER_DECAY_STEPS, PAPER_TOTAL_STEPS, SIZES


@dataclass(frozen=True)
class GridRun:
    name: str  # the released model's name; also the run directory's name
    recipe: str  # a registered recipe (recipes/registry.py)
    params: dict[str, Any] = field(default_factory=dict)
    after: str | None = None  # continues this run's final checkpoint (the sweep sets init_from to its run dir)
    branch_of: str | None = None  # a branch of this run at `branch_step` (the sweep sets checkpoint.branch_from)
    branch_step: int | None = None
    experiment: str = ""  # which part of the paper


def paper_grid() -> list[GridRun]:
    """The paper's 38 pretraining runs, parents before the runs that continue them.

    Mask-ratio sweep of pure MLM and pure CLM at 42k at every size; at 610m only: the biphasic splits at three
    budgets with their pure-MLM / pure-CLM ends, the CLM-40k → MLM-2k mask-ratio ablation, and MLM continued
    from the decayed CLM-42k and MLM-42k checkpoints. Under WSD the first `budget − 2k` steps of a 12k or 22k run
    are the 42k run's steps, and a biphasic run is the CLM-42k run up to its switch: they are branches of the two
    610m 42k runs ("MLM is resumed from CLM checkpoints that have not undergone learning-rate decay").
    """
    runs: list[GridRun] = []
    for size in SIZES:
        for ratio in paper.MASK_RATIOS:
            runs.append(GridRun(paper.mlm_name(size, ratio, 42_000), f"mlm_{size}", {"mask_ratio": ratio},
                                experiment="MLM mask ratio × size (42k)"))
        runs.append(GridRun(paper.clm_name(size, 42_000), f"clm_{size}", experiment="CLM × size (42k)"))
    size = "610m"
    clm42, mlm42 = paper.clm_name(size, 42_000), paper.mlm_name(size, 0.4, 42_000)
    for budget in (12_000, 22_000):
        stable_end = budget - PAPER_DECAY_STEPS
        runs.append(GridRun(paper.mlm_name(size, 0.4, budget), f"mlm_{size}", {"total_steps": budget},
                            experiment="biphasic split × budget (0 % CLM end)", branch_of=mlm42,
                            branch_step=stable_end))
        runs.append(GridRun(paper.clm_name(size, budget), f"clm_{size}", {"total_steps": budget},
                            experiment="biphasic split × budget (100 % CLM end)", branch_of=clm42,
                            branch_step=stable_end))
    for budget in paper.BUDGETS:
        for clm_steps in paper.BIPHASIC_CLM_STEPS[budget]:
            runs.append(GridRun(paper.biphasic_name(size, clm_steps, 0.4, budget), f"clm_mlm_{size}",
                                {"clm_steps": clm_steps, "total_steps": budget},
                                experiment="biphasic split × budget", branch_of=clm42, branch_step=clm_steps))
    for ratio in paper.MASK_RATIOS:
        runs.append(GridRun(paper.biphasic_name(size, paper.ABLATION_CLM_STEPS, ratio, 42_000), f"clm_mlm_{size}",
                            {"clm_steps": paper.ABLATION_CLM_STEPS, "total_steps": 42_000, "mask_ratio": ratio},
                            experiment="CLM 40k → MLM 2k mask ratio", branch_of=clm42,
                            branch_step=paper.ABLATION_CLM_STEPS))
    for parent in (paper.clm_name(size, 42_000), paper.mlm_name(size, 0.4, 42_000)):
        for steps in paper.CPT_STEPS:
            runs.append(GridRun(paper.cpt_name(size, parent, steps, 0.4), f"cpt_{size}", {"steps": steps},
                                after=parent, experiment=f"continued pretraining from decayed {parent}"))
    return runs


def paper_catalogue() -> PaperGrid:
    """What each paper-grid run name stands for (objective, size, budget, CLM steps, mask ratio) and the split x
    budget study, for the paper report's figures (mlmclm/eval/reports/paper_figures.py)."""
    from mlmclm.eval.reports.paper_figures import PaperGrid, PaperRun  # the report's types; launches need none of eval

    runs = {}
    for entry in paper_grid():
        kind, _, size = entry.recipe.rpartition("_")
        total = entry.params.get("total_steps", entry.params.get("steps", PAPER_TOTAL_STEPS))
        objective = {"mlm": "MLM", "clm": "CLM", "clm_mlm": "biphasic", "cpt": "CPT"}[kind]
        clm_steps = {"MLM": 0, "CLM": total, "CPT": 0}.get(objective) if objective != "biphasic" else \
            paper.biphasic_clm_steps(total, entry.params.get("clm_steps"), entry.params.get("clm_share"))
        runs[entry.name] = PaperRun(name=entry.name, objective=objective, size=size, total_steps=total,
                                    clm_steps=clm_steps,
                                    mask_ratio=None if objective == "CLM" else entry.params.get("mask_ratio", 0.4))
    return PaperGrid(runs=runs, budgets=paper.BUDGETS, biphasic_clm_steps=dict(paper.BIPHASIC_CLM_STEPS))


def tiny_grid(steps: int = 4) -> list[GridRun]:
    """The paper grid's shapes on CPU: CLM and MLM from scratch, a biphasic run branched off the CLM run, MLM
    continued from the decayed CLM run (a dependent task). Run directories and data come from the sweep's
    --run-root / --data-path."""
    half = steps // 2
    clm = f"tiny-clm-{steps}"
    return [
        GridRun(clm, "tiny_clm", {"steps": steps}, experiment="CLM"),
        GridRun(f"tiny-mlm40-{steps}", "tiny_mlm", {"steps": steps}, experiment="MLM"),
        GridRun(f"tiny-clm-{half}-mlm40-{steps}", "tiny_clm_mlm", {"steps": steps, "clm_share": 0.5},
                experiment="biphasic", branch_of=clm, branch_step=half),
        GridRun(f"tiny-clm-dec{steps}-mlm40-{steps + half}", "tiny_mlm", {"steps": half}, after=clm,
                experiment="continued pretraining"),
    ]


# The mini-replication's defaults (recipes/mini.py), sized on this project's 2-core machine: 400 steps of 8 × 128
# tokens per run, CPT for a quarter of that, three pretraining seeds.
MINI_STEPS, MINI_CPT_STEPS, MINI_SEEDS, MINI_SPLITS = 400, 100, (1, 2, 3), (0.25, 0.5, 0.75)
# What the demo found to learn on 2 CPU cores (recipes/demo.py DEMO_OVERRIDES: peak LR 2e-3, micro batch 4), and
# 32 held-out samples per validation (4 global batches) for steadier curves. The mask ratio stays the paper's 40 %.
MINI_COMMON = {"lr": 2e-3, "micro_batch": 4, "validation_samples": 32}


def seed_label(name: str, seed: int) -> str:
    """A pretraining seed's run of `name`: the `-s<seed>` suffix the report groups by
    (mlmclm.eval.reports.seed_groups)."""
    return f"{name}-s{seed}"


def mini_grid(steps: int = MINI_STEPS, cpt_steps: int = MINI_CPT_STEPS, seeds: tuple[int, ...] = MINI_SEEDS,
              splits: tuple[float, ...] = MINI_SPLITS,
              mask_schedule: tuple[float, float] | None = None) -> list[GridRun]:
    """The paper's design at CPU scale, once per pretraining seed: MLM-40 % and CLM from scratch for `steps`; CLM
    then MLM at each CLM share of `splits`, branched off the CLM run's stable phase at its switch (every run of the
    budget decays over its last fifth, as the paper's all decay over their last 2k steps); MLM continued for
    `cpt_steps` from the decayed CLM and from the decayed MLM run. Names carry `-s<seed>`.

    `mask_schedule` (start, end), beyond the paper: one more branch per seed, at the middle split, whose MLM rate
    falls linearly from start to end over its phase — beside the constant-40 % branch of the same split."""
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"mini grid: seeds must be distinct and at least one, got {seeds}")
    decay = max(1, steps // 5)
    runs: list[GridRun] = []
    for seed in seeds:
        common = {**MINI_COMMON, "seed": seed}
        clm, mlm = seed_label(f"mini-clm-{steps}", seed), seed_label(f"mini-mlm40-{steps}", seed)
        runs.append(GridRun(clm, "tiny_clm", {"steps": steps, **common}, experiment="CLM"))
        runs.append(GridRun(mlm, "tiny_mlm", {"steps": steps, **common}, experiment="MLM"))
        for share in splits:
            switch = round(steps * share)
            if not 0 < switch < steps - decay:
                raise ValueError(f"mini grid: CLM share {share} switches at step {switch}, outside the CLM run's "
                                 f"stable phase (steps 1..{steps - decay - 1} of {steps})")
            runs.append(GridRun(seed_label(f"mini-clm-{switch}-mlm40-{steps}", seed), "tiny_clm_mlm",
                                {"steps": steps, "clm_share": share, "decay_steps": decay, **common},
                                experiment="biphasic split", branch_of=clm, branch_step=switch))
        if mask_schedule is not None:
            start, end = mask_schedule
            share = sorted(splits)[len(splits) // 2]
            switch = round(steps * share)
            runs.append(GridRun(seed_label(f"mini-clm-{switch}-mlm{start:.0%}to{end:.0%}-{steps}".replace("%", ""),
                                           seed), "tiny_clm_mlm",
                                {"steps": steps, "clm_share": share, "decay_steps": decay, "mask_ratio": start,
                                 "mask_schedule": "linear", "mask_ratio_end": end, **common},
                                experiment="biphasic split, mask-rate schedule", branch_of=clm, branch_step=switch))
        for parent, kind in ((clm, "clm"), (mlm, "mlm40")):
            runs.append(GridRun(seed_label(f"mini-{kind}-dec{steps}-mlm40-{cpt_steps}", seed), "tiny_mlm",
                                {"steps": cpt_steps, **common}, after=parent,
                                experiment=f"continued pretraining from decayed {kind.upper()}"))
    return runs


GRIDS = {"paper": paper_grid, "tiny": tiny_grid, "mini": mini_grid}


def get_grid(name: str, **options) -> list[GridRun]:
    """The grid's runs, checked (unique names, parents first); `options` are the grid function's arguments."""
    if name not in GRIDS:
        raise ValueError(f"unknown grid {name!r}; choose one of {sorted(GRIDS)}")
    runs = GRIDS[name](**options)
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"grid {name}: duplicate run names")
    for r in runs:
        parent = r.after or r.branch_of
        if parent is not None and parent not in names[: names.index(r.name)]:
            raise ValueError(f"grid {name}: {r.name} depends on {parent}, which is not an earlier run of the grid")
        if (r.branch_of is None) != (r.branch_step is None) or (r.branch_of and r.after):
            raise ValueError(f"grid {name}: {r.name}: branch_of and branch_step go together, without after")
    return runs
