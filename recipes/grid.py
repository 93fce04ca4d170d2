"""The experiment grids as data: every pretraining run of the paper (38 models), and a scaled-down CPU grid with
the same structure (from-scratch runs, a biphasic run, a CPT run that depends on a decayed parent).

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
from recipes.base import PAPER_DECAY_STEPS, SIZES


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


GRIDS = {"paper": paper_grid, "tiny": tiny_grid}


def get_grid(name: str) -> list[GridRun]:
    if name not in GRIDS:
        raise ValueError(f"unknown grid {name!r}; choose one of {sorted(GRIDS)}")
    runs = GRIDS[name]()
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
