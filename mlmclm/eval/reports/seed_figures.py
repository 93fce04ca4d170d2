"""The paper's figures over pretraining seeds (PNG, matplotlib Agg), from `pretraining.json` and the seed table:

* the biphasic split × budget figure: x = CLM share of the budget (0 % = MLM, 100 % = CLM), one line per budget,
  one panel per measure (validation losses at the last step, fill-mask, fine-tuning family scores);
* continued-pretraining curves: validation losses over the continued steps, from the decayed CLM and MLM runs;
* validation-loss curves (data efficiency): validation CLM and MLM losses over the pretraining steps per run.

Points and lines are means over pretraining seeds; bars and bands their 95 % CIs (none with one seed).
"""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from mlmclm.atomic_write import atomic_file
from mlmclm.eval.finetune.metrics import mean_ci95
from mlmclm.eval.reports.pretraining_runs import PretrainedModel
from mlmclm.eval.reports.seed_groups import SeedTable

SPLIT_PNG, CPT_PNG, CURVES_PNG = "biphasic_seeds.png", "cpt_curves.png", "validation_curves.png"
_LOSSES = (("mlm", 2, "validation MLM-40 % loss"), ("clm", 1, "validation CLM loss"))
_COLOURS = {"MLM": "tab:blue", "CLM": "tab:orange", "CPT": "tab:purple"}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    with atomic_file(path, "wb") as stream:
        fig.savefig(stream, dpi=100, format="png")
    _plt().close(fig)


def _seeds(runs: list[PretrainedModel]) -> str:
    return f"{len(runs)} seed" + ("s" if len(runs) != 1 else "")


def _by_base(models: list[PretrainedModel]) -> dict[str, list[PretrainedModel]]:
    groups: dict[str, list[PretrainedModel]] = defaultdict(list)
    for m in models:
        groups[m.base].append(m)
    return dict(groups)


def seed_curve(runs: list[PretrainedModel], column: int) -> tuple[list[int], list[float], list[float]]:
    """Steps every seed logged, and the mean and CI (0 with one seed) of validation column 1 (CLM) or 2 (MLM)."""
    per_step: dict[int, list[float]] = defaultdict(list)
    for run in runs:
        for point in run.validation:
            per_step[point[0]].append(point[column])
    steps = sorted(s for s, v in per_step.items() if len(v) == len(runs))
    stats = [mean_ci95(per_step[s]) for s in steps]
    return steps, [m for m, _ in stats], [c if math.isfinite(c) else 0.0 for _, c in stats]


def _band(ax, steps, means, cis, **style) -> None:
    ax.plot(steps, means, **style)
    ax.fill_between(steps, np.subtract(means, cis), np.add(means, cis), color=style.get("color"), alpha=0.2, lw=0)


def split_figure(models: list[PretrainedModel], table: SeedTable, path: Path) -> int:
    """x = CLM share, y = each column of the seed table (mean ± CI over seeds), one line per budget; returns the
    points drawn (0: nothing written)."""
    points = {}  # base -> (budget, CLM share, variant): a variant (beyond the paper's design) gets its own line
    for base, runs in _by_base(models).items():
        if runs[0].objective in ("MLM", "CLM", "biphasic"):
            points[base] = (runs[0].total_steps, runs[0].clm_share, runs[0].variant)
    columns = [c for c in table.columns if any((b, c) in table.cells for b in points)]
    if len(points) < 2 or not columns:
        return 0
    plt = _plt()
    fig, axes = plt.subplots(1, len(columns), figsize=(3.6 * len(columns), 3.6), squeeze=False)
    drawn = 0
    for column, ax in zip(columns, axes[0]):
        scale = 100 if column in table.percent else 1
        for budget, variant in sorted({(b, v or "") for b, _, v in points.values()}):
            line = sorted(((share, table.cells[(base, column)]) for base, (b, share, v) in points.items()
                           if b == budget and (v or "") == variant and (base, column) in table.cells),
                          key=lambda point: point[0])
            if not line:
                continue
            ax.errorbar([s for s, _ in line], [scale * c.mean for _, c in line], marker="s" if variant else "o",
                        capsize=3, yerr=[scale * c.ci95 if math.isfinite(c.ci95) else 0.0 for _, c in line],
                        label=f"{budget} steps" + (f", {variant}" if variant else ""))
            drawn += len(line)
        ax.set_title(column + (" (%)" if scale == 100 else " (nats)"), fontsize=9)
        ax.set_xlabel("CLM share of the budget (%)")
        ax.set_xlim(-8, 108)
        ax.legend(fontsize=7)
    _save(fig, path)
    return drawn


def cpt_figure(models: list[PretrainedModel], path: Path) -> int:
    """Validation losses over the continued steps (step 0: the decayed parent), one line per parent objective;
    the from-scratch MLM runs' last validation loss dashed. Returns the lines drawn."""
    groups = {base: runs for base, runs in _by_base(models).items() if runs[0].objective == "CPT"}
    if not groups:
        return 0
    scratch = [runs for runs in _by_base(models).values() if runs[0].objective == "MLM"]
    plt = _plt()
    fig, axes = plt.subplots(1, len(_LOSSES), figsize=(5.5 * len(_LOSSES), 3.8), squeeze=False)
    lines = 0
    for (kind, column, title), ax in zip(_LOSSES, axes[0]):
        for base, runs in sorted(groups.items()):
            steps, means, cis = seed_curve(runs, column)
            parent = runs[0].parent_objective or "?"
            _band(ax, steps, means, cis, color=_COLOURS.get(parent), marker=".",
                  label=f"MLM continued from decayed {parent} ({_seeds(runs)})")
            lines += 1
        for runs in scratch:
            mean = float(np.mean([r.final(kind) for r in runs]))
            ax.axhline(mean, color=_COLOURS["MLM"], ls="--", lw=1,
                       label=f"{runs[0].base} at its last step (seed mean)")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("continued-pretraining steps")
        ax.set_ylabel("nats")
        ax.legend(fontsize=7)
    _save(fig, path)
    return lines


def curves_figure(models: list[PretrainedModel], path: Path) -> int:
    """Validation CLM and MLM losses over the pretraining steps, one band per from-scratch or biphasic run."""
    groups = {base: runs for base, runs in _by_base(models).items() if runs[0].objective != "CPT"}
    if not groups:
        return 0
    plt = _plt()
    fig, axes = plt.subplots(1, len(_LOSSES), figsize=(6.5 * len(_LOSSES), 4.2), squeeze=False)
    greens = plt.get_cmap("Greens")
    biphasic = sorted((runs[0].clm_share, base) for base, runs in groups.items() if runs[0].objective == "biphasic")
    colour = {base: greens(0.45 + 0.5 * i / max(1, len(biphasic) - 1)) for i, (_, base) in enumerate(biphasic)}
    lines = 0
    for (_, column, title), ax in zip(_LOSSES, axes[0]):
        for base, runs in sorted(groups.items(), key=lambda item: (item[1][0].clm_share, item[0])):
            steps, means, cis = seed_curve(runs, column)
            _band(ax, steps, means, cis, color=colour.get(base, _COLOURS.get(runs[0].objective)), lw=1.2,
                  label=f"{base} ({_seeds(runs)})")
            switch = runs[0].clm_steps
            if runs[0].objective == "biphasic":
                ax.axvline(switch, color=colour[base], ls=":", lw=0.8)
            lines += 1
        ax.set_title(f"{title} over pretraining steps (dotted: CLM→MLM switches)", fontsize=9)
        ax.set_xlabel("pretraining steps")
        ax.set_ylabel("nats")
        ax.legend(fontsize=7)
    _save(fig, path)
    return lines


def write_seed_figures(models: list[PretrainedModel], table: SeedTable, out: Path) -> dict[str, str]:
    """Each figure that has data, under `out` (a stale one from an earlier report is removed); name -> what it
    shows or why it was not drawn."""
    notes = {}
    for name, draw, what in ((SPLIT_PNG, lambda p: split_figure(models, table, p),
                              "biphasic split × budget over pretraining seeds, {} points"),
                             (CPT_PNG, lambda p: cpt_figure(models, p), "continued-pretraining curves, {} runs"),
                             (CURVES_PNG, lambda p: curves_figure(models, p),
                              "validation losses over pretraining steps (data efficiency), {} runs")):
        (out / name).unlink(missing_ok=True)
        count = draw(out / name)
        notes[name] = what.format(count) if count else "not drawn: no pretraining.json run of that kind"
    return notes
