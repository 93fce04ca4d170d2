"""Comparison of several runs: loss per objective vs tokens, downstream score vs pretraining steps, stability;
PNG plots and a Markdown table labelled by run (e.g. CLM / MLM-40 / CLM25->MLM75)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlmclm.atomic_write import atomic_file, write_atomic
from mlmclm.eval.finetune.protocol import load_records
from mlmclm.eval.reports.data_efficiency import CURVE_FILE, read_curve
from mlmclm.eval.reports.summary import family_results, stability_results
from mlmclm.eval.reports.tensorboard_logs import OBJECTIVES, loss_tag, read_scalars, tokens_at


@dataclass(frozen=True)
class RunInputs:
    """One run to compare: its TensorBoard log folder and/or its evaluation output folder."""

    label: str
    log_dir: Path | None = None
    eval_dir: Path | None = None

    def __post_init__(self) -> None:
        if not self.label:
            raise ValueError("run label must be non-empty")
        if self.log_dir is None and self.eval_dir is None:
            raise ValueError(f"run {self.label!r}: give a TensorBoard log folder, an eval folder, or both")
        for name in ("log_dir", "eval_dir"):
            path = getattr(self, name)
            if path is not None and not Path(path).is_dir():
                raise FileNotFoundError(f"run {self.label!r}: {name} {path} is not a folder")


def _fmt(value: float | None, scale: float = 1.0, digits: int = 3) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value * scale:.{digits}g}"


def compare_runs(runs: list[RunInputs], output_dir: Path) -> Path:
    """Write loss_vs_tokens.png, downstream_vs_steps.png, stability.png (each when there is data) and
    comparison.md under `output_dir`; returns the Markdown path."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    if not runs:
        raise ValueError("compare_runs: no runs given")
    labels = [r.label for r in runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"compare_runs: run labels must be unique, got {labels}")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    scalars = {r.label: read_scalars(r.log_dir) for r in runs if r.log_dir is not None}
    curves = {r.label: read_curve(Path(r.eval_dir) / CURVE_FILE) for r in runs
              if r.eval_dir is not None and (Path(r.eval_dir) / CURVE_FILE).exists()}
    records = {r.label: load_records(r.eval_dir) for r in runs if r.eval_dir is not None}
    records = {k: v for k, v in records.items() if v}
    images = []

    if scalars:
        fig, axes = plt.subplots(1, len(OBJECTIVES), figsize=(6 * len(OBJECTIVES), 4), squeeze=False)
        for ax, objective in zip(axes[0], OBJECTIVES):
            for label, series in scalars.items():
                loss = series.get(loss_tag(objective))
                if loss is None:
                    continue
                tokens = tokens_at(series, loss.steps)
                ax.plot(loss.steps if tokens is None else tokens, loss.values, label=label)
            ax.set_title(f"{objective.upper()} loss")
            ax.set_xlabel("consumed tokens (steps where not logged)")
            ax.set_ylabel("loss")
            if ax.get_legend_handles_labels()[0]:
                ax.legend()
        images.append(_save(fig, output_dir / "loss_vs_tokens.png"))

    if curves:
        fig, ax = plt.subplots(figsize=(7, 4))
        for label, points in curves.items():
            ax.plot([p["iteration"] for p in points], [100 * p["mean_score"] for p in points], marker="o", label=label)
        ax.set_xlabel("pretraining iteration")
        ax.set_ylabel("mean downstream test score (%)")
        ax.legend()
        images.append(_save(fig, output_dir / "downstream_vs_steps.png"))

    boxes = stability_boxes(records)
    if boxes:
        images.append(_save(_stability_figure(boxes, list(records)), output_dir / "stability.png"))

    lines = ["# Run comparison", "", "| run | final CLM loss | final MLM loss | tokens | "
             + " | ".join(f"{f} (test %)" for f in _families(records)) + " | std all runs | diverged |",
             "|---|---|---|---|" + "---|" * len(_families(records)) + "---|---|"]
    for label in labels:
        series = scalars.get(label, {})
        losses = [_fmt(float(series[loss_tag(o)].values[-1])) if loss_tag(o) in series else "n/a" for o in OBJECTIVES]
        tokens = "n/a"
        if series:
            last_step = max(int(s.steps[-1]) for s in series.values() if s.steps.size)
            at = tokens_at(series, np.array([last_step]))
            tokens = "n/a" if at is None else f"{at[0]:.3g}"
        fam = {f.family: f.test_mean for f in family_results(records[label])} if label in records else {}
        stab = [s for s in stability_results(records[label]) if s.task == "(all)"] if label in records else []
        cells = [_fmt(fam.get(f), 100) for f in _families(records)]
        lines.append(f"| {label} | {' | '.join(losses)} | {tokens} | " + "".join(f"{c} | " for c in cells)
                     + f"{_fmt(stab[0].std_over_runs, 100) if stab else 'n/a'} | "
                     + f"{(f'{100 * stab[0].diverged_fraction:.0f} %') if stab else 'n/a'} |")
    lines += ["", "Plots: " + (", ".join(f"![{p.stem}]({p.name})" for p in images) if images else "none (no data)")]
    markdown = output_dir / "comparison.md"
    write_atomic(markdown, "\n".join(lines) + "\n")
    return markdown


@dataclass(frozen=True)
class StabilityBox:
    """The test scores (%) of every (LR, seed) run of one run label on one task."""

    task: str
    label: str
    scores: tuple[float, ...]


def stability_boxes(records: dict[str, list]) -> list[StabilityBox]:
    """One box per (task, run label), tasks sorted, labels in the given order. Tasks are never pooled: their
    scales differ (NDCG vs accuracy), so a pooled box would show the spread between tasks, not over seeds and LRs."""
    tasks = sorted({r.task for recs in records.values() for r in recs})
    boxes = []
    for task in tasks:
        for label, recs in records.items():
            scores = tuple(100 * r.test_score for r in recs if r.task == task and math.isfinite(r.test_score))
            if scores:
                boxes.append(StabilityBox(task, label, scores))
    return boxes


def _stability_figure(boxes: list[StabilityBox], labels: list[str]):
    """Boxes grouped by task along x, one colour per run label."""
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(b.task for b in boxes))
    width = 0.8 / len(labels)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(max(7.0, 1.2 * len(tasks) * len(labels)), 4))
    for index, label in enumerate(labels):
        mine = [b for b in boxes if b.label == label]
        if not mine:
            continue
        positions = [tasks.index(b.task) + (index - (len(labels) - 1) / 2) * width for b in mine]
        colour = colours[index % len(colours)]
        ax.boxplot([b.scores for b in mine], positions=positions, widths=0.9 * width, patch_artist=True,
                   boxprops={"facecolor": colour, "alpha": 0.6}, medianprops={"color": "black"}, manage_ticks=False)
        ax.plot([], [], color=colour, linewidth=8, alpha=0.6, label=label)  # legend entry
    ax.set_xticks(range(len(tasks)), tasks, rotation=30, ha="right")
    ax.set_ylabel("test score of every (LR, seed) run (%)")
    ax.set_title("stability over seeds and learning rates, per task")
    ax.legend()
    return fig


def _families(records) -> list[str]:
    return sorted({r.family for recs in records.values() for r in recs})


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with atomic_file(path, "wb") as stream:
        fig.savefig(stream, dpi=100, format="png")
    plt.close(fig)
    return path
