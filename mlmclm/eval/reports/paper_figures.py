"""The paper's figures from run records (PNG, matplotlib Agg): the biphasic split x budget figure, data-efficiency
curves, and fine-tuning stability (one box per task). Model labels are the paper's run names; what a name means
(objective, budget, CLM steps) comes from a `PaperGrid` the caller passes in (`recipes/grid.py: paper_catalogue`),
never re-parsed here — the library does not import the recipes built on it."""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from mlmclm.atomic_write import atomic_file
from mlmclm.eval.finetune.protocol import RunRecord
from mlmclm.eval.finetune.task_spec import FAMILY_SHORT
from mlmclm.eval.reports.summary import family_results

OBJECTIVE_COLOURS = {"MLM": "tab:blue", "CLM": "tab:orange", "biphasic": "tab:green", "CPT": "tab:purple"}
BIPHASIC_PNG, EFFICIENCY_PNG, STABILITY_PNG = "biphasic.png", "data_efficiency.png", "stability.png"


@dataclass(frozen=True)
class PaperRun:
    """What a paper-grid run name stands for."""

    name: str
    objective: str  # MLM, CLM, biphasic or CPT
    size: str
    total_steps: int
    clm_steps: int  # 0 for MLM, total_steps for CLM
    mask_ratio: float | None  # None for CLM


@dataclass(frozen=True)
class PaperGrid:
    """The paper's runs by name and its split x budget study: the budgets and, per budget, the CLM steps of its
    biphasic splits (at `study_size`, MLM at `study_mask_ratio`). Empty: no label is a paper run."""

    runs: dict[str, PaperRun] = field(default_factory=dict)
    budgets: tuple[int, ...] = ()
    biphasic_clm_steps: dict[int, tuple[int, ...]] = field(default_factory=dict)
    study_size: str = "610m"
    study_mask_ratio: float = 0.4


def biphasic_point(name: str, grid: PaperGrid) -> tuple[int, float] | None:
    """(budget, CLM share in %) when `name` is a run of the paper's split x budget study (610m, MLM at 40 %, CLM
    steps 0, the grid's biphasic splits, or all); None otherwise (other sizes, mask ratios, the 40k ablation, CPT)."""
    run = grid.runs.get(name)
    if run is None or run.size != grid.study_size or run.objective == "CPT" or run.total_steps not in grid.budgets:
        return None
    if run.objective != "CLM" and run.mask_ratio != grid.study_mask_ratio:
        return None
    if run.objective == "biphasic" and run.clm_steps not in grid.biphasic_clm_steps.get(run.total_steps, ()):
        return None
    return run.total_steps, 100.0 * run.clm_steps / run.total_steps


def checkpoint_of(label: str, grid: PaperGrid) -> tuple[PaperRun, int] | None:
    """(run, pretraining step) for `<run name>` (its final step) or `<run name>-<step>` (an intermediate
    checkpoint, as the released `610m-mlm40-42k-1000`); None for labels outside the paper grid and for CPT runs."""
    runs = grid.runs
    base, _, suffix = label.rpartition("-")
    if label in runs:
        run, step = runs[label], runs[label].total_steps
    elif base in runs and suffix.isdigit():
        run, step = runs[base], int(suffix)
    else:
        return None
    return None if run.objective == "CPT" else (run, step)


def _plt():
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    plt = _plt()
    fig.tight_layout()
    with atomic_file(path, "wb") as stream:
        fig.savefig(stream, dpi=100, format="png")
    plt.close(fig)


def _family_scores(records: list[RunRecord]) -> dict[str, dict[str, tuple[float, float]]]:
    """model -> family short name -> (mean, CI) in percent."""
    scores: dict[str, dict[str, tuple[float, float]]] = defaultdict(dict)
    for f in family_results(records):
        scores[f.model][FAMILY_SHORT[f.family]] = (100 * f.test_mean, 100 * f.test_ci95)
    return scores


def _family_axes(plt, families: list[str]):
    fig, axes = plt.subplots(1, len(families), figsize=(4.5 * len(families), 3.8), squeeze=False)
    return fig, dict(zip(families, axes[0]))


def _ordered(families) -> list[str]:
    return [f for f in FAMILY_SHORT.values() if f in families]


def biphasic_figure(records: list[RunRecord], path: Path, grid: PaperGrid) -> int:
    """x = CLM share of the steps (0..100 %), one line per budget, y = family score (± CI); returns the number of
    points drawn (0: nothing written)."""
    scores = _family_scores(records)
    points = {m: biphasic_point(m, grid) for m in scores}
    points = {m: p for m, p in points.items() if p is not None}
    if not points:
        return 0
    plt = _plt()
    families = _ordered({f for m in points for f in scores[m]})
    fig, axes = _family_axes(plt, families)
    drawn = 0
    for family, ax in axes.items():
        for budget in sorted({b for b, _ in points.values()}):
            line = sorted((share, *scores[m][family]) for m, (b, share) in points.items()
                          if b == budget and family in scores[m])
            if not line:
                continue
            shares, means, cis = zip(*line)
            ax.errorbar(shares, means, yerr=[c if math.isfinite(c) else 0.0 for c in cis], marker="o", capsize=3,
                        label=f"{budget // 1000}k steps")
            drawn += len(line)
        ax.set_title(family)
        ax.set_xlabel("CLM share of the pretraining steps (%)")
        ax.set_xlim(-5, 105)
        ax.set_ylabel("test score (%)")
        ax.legend()
    _save(fig, path)
    return drawn


def efficiency_series(records: list[RunRecord], curves: dict[str, list[dict]], grid: PaperGrid):
    """(run label, objective) -> family -> [(step, score %)], from checkpoint-labelled records and curve.json files."""
    series: dict[tuple[str, str], dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for model, families in _family_scores(records).items():
        found = checkpoint_of(model, grid)
        if found is None:
            continue
        run, step = found
        for family, (mean, _) in families.items():
            series[(run.name, run.objective)][family].append((step, mean))
    for label, points in curves.items():
        run = grid.runs.get(label)
        key = (label, run.objective if run else "run")
        for point in points:
            for family, score in point["family_scores"].items():
                if family in FAMILY_SHORT and isinstance(score, (int, float)):
                    series[key][FAMILY_SHORT[family]].append((point["iteration"], 100 * score))
    return {k: {f: sorted(v) for f, v in fams.items()} for k, fams in series.items()}


def efficiency_figure(records: list[RunRecord], curves: dict[str, list[dict]], path: Path, grid: PaperGrid) -> int:
    """Score vs pretraining steps per family, one line per run coloured by objective (MLM / CLM / biphasic); drawn
    only when some run has checkpoints at two or more steps. Returns the number of lines drawn."""
    series = {k: v for k, v in efficiency_series(records, curves, grid).items()
              if any(len({s for s, _ in points}) > 1 for points in v.values())}
    if not series:
        return 0
    plt = _plt()
    families = _ordered({f for fams in series.values() for f in fams})
    fig, axes = _family_axes(plt, families)
    lines = 0
    for family, ax in axes.items():
        for (label, objective), fams in sorted(series.items()):
            if family not in fams:
                continue
            steps, values = zip(*fams[family])
            ax.plot(steps, values, marker="o", color=OBJECTIVE_COLOURS.get(objective), label=f"{label} ({objective})")
            lines += 1
        ax.set_title(family)
        ax.set_xlabel("pretraining steps")
        ax.set_ylabel("test score (%)")
        ax.legend(fontsize="small")
    _save(fig, path)
    return lines


def stability_figure(records: list[RunRecord], path: Path) -> dict[str, list[str]]:
    """One panel per model, one box per task over every (LR, seed) run's test score; tick labels name the task and
    its family. Returns model -> the tasks boxed, in the order matplotlib drew them."""
    plt = _plt()
    by_model: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    family_of = {}
    for r in records:
        family_of[r.task] = FAMILY_SHORT[r.family]
        scores = by_model[r.model][r.task]  # a task whose runs all diverged still gets its (empty) box
        if math.isfinite(r.test_score):
            scores.append(100 * r.test_score)
    order = list(FAMILY_SHORT.values())
    models = sorted(by_model)
    fig, axes = plt.subplots(len(models), 1, figsize=(max(6, 1.1 * len(family_of)), 3.2 * len(models)),
                             squeeze=False)
    boxed = {}
    for model, ax in zip(models, axes[:, 0]):
        tasks = sorted(by_model[model], key=lambda t: (order.index(family_of[t]), t))
        drawn = ax.boxplot([by_model[model][t] for t in tasks], tick_labels=[f"{t}\n({family_of[t]})" for t in tasks])
        if len(drawn["boxes"]) != len(tasks):
            raise RuntimeError(f"stability figure: {len(drawn['boxes'])} boxes drawn for {len(tasks)} tasks")
        boxed[model] = tasks
        ax.set_title(f"{model}: test score over every (learning rate, seed) run")
        ax.set_ylabel("test score (%)")
    _save(fig, path)
    return boxed


def write_figures(records: list[RunRecord], curves: dict[str, list[dict]], out: Path,
                  grid: PaperGrid | None = None) -> dict[str, str]:
    """Write every figure that has data under `out`; returns file name -> what it shows (or why it was skipped).
    A figure not drawn this time is removed, so a forced rewrite never leaves a stale one beside the new table.
    Without `grid` no label is read as a paper run (no biphasic figure)."""
    grid = grid or PaperGrid()
    for name in (BIPHASIC_PNG, EFFICIENCY_PNG):
        (out / name).unlink(missing_ok=True)
    notes = {}
    drawn = biphasic_figure(records, out / BIPHASIC_PNG, grid)
    notes[BIPHASIC_PNG] = (f"biphasic split × budget, {drawn} (model, family) points" if drawn else
                           "not drawn: no model is a run of the paper's split × budget study (610m, MLM 40 %, "
                           "budgets 12k/22k/42k; names as in recipes/grid.py)")
    lines = efficiency_figure(records, curves, out / EFFICIENCY_PNG, grid)
    notes[EFFICIENCY_PNG] = (f"score vs pretraining steps, {lines} lines" if lines else
                             "not drawn: no run has checkpoints at two or more steps (labels `<run>-<step>` or "
                             "curve.json)")
    boxed = stability_figure(records, out / STABILITY_PNG)
    notes[STABILITY_PNG] = "one box per task (every LR × seed run): " + "; ".join(
        f"{m}: {len(t)} tasks" for m, t in boxed.items())
    return notes
