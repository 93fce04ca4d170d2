"""The detour's downstream scores: what the evaluation's grid (`tools/evaluate.py grid`, one output folder for both
runs' exports) recorded, as the evaluation's own summary computes it — per task the LR chosen on validation, then
the test score's mean and 95 % CI (Student t) over the fine-tuning seeds — and, as the paper reports one mean F1
per run, the mean over tasks: per seed the mean of the tasks' scores at their chosen LRs, then mean and CI over the
seeds every task ran."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from mlmclm.eval.finetune.metrics import mean_ci95
from mlmclm.eval.finetune.protocol import RunRecord, load_records
from mlmclm.eval.reports.summary import finite_or_null, task_results

MEAN = "mean over tasks"


def _cell(scores: list[float], metric: str, lr: float | None = None) -> dict:
    mean, ci = mean_ci95(scores)
    return {"mean": mean, "ci95": ci, "seeds": len(scores), "metric": metric, "lr": lr}


def downstream_scores(records: list[RunRecord]) -> dict:
    """{"tasks": [names], "runs": {model: {task: cell, MEAN: cell}}}; a cell is {mean, ci95 (NaN for one seed),
    seeds, metric, lr}. Empty runs when there are no records."""
    per_task = task_results(records)
    runs: dict[str, dict] = {}
    for result in per_task:
        runs.setdefault(result.model, {})[result.task] = _cell(list(result.test_scores), result.metric,
                                                               result.best_lr)
    for model, cells in runs.items():
        chosen = {t.task: t.best_lr for t in per_task if t.model == model}
        by_seed: dict[int, dict[str, float]] = {}
        for r in records:
            if r.model == model and r.learning_rate == chosen[r.task]:
                by_seed.setdefault(r.seed, {})[r.task] = r.test_score
        complete = [scores for _, scores in sorted(by_seed.items()) if set(scores) == set(chosen)]
        if complete:  # only the seeds every task ran: a seed missing a task would not be the same mean
            cells[MEAN] = _cell([float(np.mean(list(s.values()))) for s in complete], "mean")
    return {"tasks": sorted({t.task for t in per_task}), "runs": runs}


def read_scores(eval_dir: Path) -> dict | None:
    """The scores of the run records under `eval_dir` (None when it holds none: not evaluated yet)."""
    records = load_records(Path(eval_dir)) if Path(eval_dir).is_dir() else []
    return downstream_scores(records) if records else None


def score_text(cell: dict | None) -> str:
    """Percent, `mean ± half-width (n seeds)`; `—` where not measured."""
    if cell is None:
        return "—"
    if not math.isfinite(cell["ci95"]):
        return f"{100 * cell['mean']:.1f} (1 seed: no interval)"
    return f"{100 * cell['mean']:.1f} ± {100 * cell['ci95']:.1f} ({cell['seeds']} seeds)"


def scores_json(scores: dict) -> dict:
    """For report.json: an undefined interval (one seed) as null."""
    return finite_or_null(scores)
