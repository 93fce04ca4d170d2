"""Aggregation of run records: per-task and per-family results (mean ± 95 % CI over seeds at the LR chosen on
validation) and the stability report (spread over seeds and LRs, diverged runs); Markdown and JSON output."""
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from mlmclm.atomic_write import write_atomic
from mlmclm.bounded_read import read_regular_text
from mlmclm.eval.finetune.metrics import mean_ci95
from mlmclm.eval.finetune.protocol import FEW_STEPS, RunRecord, group_runs, select_learning_rate, write_json_atomic
from mlmclm.eval.finetune.task_spec import MAIN_METRIC


@dataclass(frozen=True)
class TaskResult:
    model: str
    task: str
    family: str
    metric: str
    best_lr: float
    validation_mean: float
    test_scores: tuple[float, ...]  # one per seed at best_lr
    test_mean: float
    test_ci95: float
    steps: tuple[int, int] = (0, 0)  # fewest and most optimizer steps of the task's runs


@dataclass(frozen=True)
class FamilyResult:
    model: str
    family: str
    tasks: tuple[str, ...]
    seeds: int
    test_mean: float
    test_ci95: float


@dataclass(frozen=True)
class StabilityResult:
    model: str
    task: str  # "(all)" for the per-model aggregate
    runs: int
    std_over_seeds: float  # at the selected LR
    std_over_runs: float  # all LRs and seeds
    worst_to_best_gap: float  # best minus worst test score over all runs
    diverged_fraction: float


def task_results(records: list[RunRecord]) -> list[TaskResult]:
    results = []
    for (model, task), runs in sorted(group_runs(records).items()):
        best_lr = select_learning_rate(runs)
        chosen = sorted((r for r in runs if r.learning_rate == best_lr), key=lambda r: r.seed)
        scores = tuple(r.test_score for r in chosen)
        mean, ci = mean_ci95(scores)
        results.append(TaskResult(model=model, task=task, family=chosen[0].family, metric=chosen[0].main_metric,
                                  best_lr=best_lr, validation_mean=float(np.mean([r.validation_score for r in chosen])),
                                  test_scores=scores, test_mean=mean, test_ci95=ci,
                                  steps=(min(r.steps for r in runs), max(r.steps for r in runs))))
    return results


def standard_results(records: list[RunRecord]) -> dict[tuple[str, str], TaskResult]:
    """Per (model, task) run under EncodEval's rules (`extra.rules`), the family's standard metric
    (tasks.MAIN_METRIC: accuracy, seqeval entity F1, SQuAD F1 with windows, NDCG@10) that its runs report beside
    EncodEval's score — its learning rate chosen on its own validation, as any main metric's is."""
    projected = [replace(r, main_metric=MAIN_METRIC[r.family]) for r in records
                 if r.extra.get("rules") == "encodeval" and MAIN_METRIC[r.family] in r.test]
    return {(t.model, t.task): t for t in task_results(projected)} if projected else {}


def family_results(records: list[RunRecord]) -> list[FamilyResult]:
    """Per seed, the mean over the family's tasks at each task's selected LR; then mean ± CI over seeds."""
    per_task = task_results(records)
    chosen_lr = {(t.model, t.task): t.best_lr for t in per_task}
    by_family: dict[tuple[str, str], dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        if r.learning_rate == chosen_lr[(r.model, r.task)]:
            by_family[(r.model, r.family)][r.task][r.seed] = r.test_score
    results = []
    for (model, family), tasks in sorted(by_family.items()):
        seeds = sorted(set.intersection(*(set(s) for s in tasks.values())))
        if not seeds:  # no seed shared by all tasks: report the plain mean without an interval
            mean, ci = float(np.mean([np.mean(list(s.values())) for s in tasks.values()])), float("nan")
        else:
            mean, ci = mean_ci95([np.mean([tasks[t][seed] for t in tasks]) for seed in seeds])
        results.append(FamilyResult(model=model, family=family, tasks=tuple(sorted(tasks)), seeds=len(seeds),
                                    test_mean=mean, test_ci95=ci))
    return results


def _std(values) -> float:
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def stability_results(records: list[RunRecord]) -> list[StabilityResult]:
    results = []
    per_model: dict[str, list[StabilityResult]] = defaultdict(list)
    for (model, task), runs in sorted(group_runs(records).items()):
        best_lr = select_learning_rate(runs)
        scores = [r.test_score for r in runs]
        finite = [s for s in scores if math.isfinite(s)]
        result = StabilityResult(
            model=model, task=task, runs=len(runs),
            std_over_seeds=_std([r.test_score for r in runs if r.learning_rate == best_lr]),
            std_over_runs=_std(finite), worst_to_best_gap=(max(finite) - min(finite)) if finite else float("nan"),
            diverged_fraction=float(np.mean([r.diverged or not math.isfinite(r.test_score) for r in runs])))
        results.append(result)
        per_model[model].append(result)
    for model, rows in sorted(per_model.items()):
        total = sum(r.runs for r in rows)
        results.append(StabilityResult(
            model=model, task="(all)", runs=total,
            std_over_seeds=float(np.mean([r.std_over_seeds for r in rows])),
            std_over_runs=float(np.mean([r.std_over_runs for r in rows])),
            worst_to_best_gap=float(np.mean([r.worst_to_best_gap for r in rows])),
            diverged_fraction=sum(r.diverged_fraction * r.runs for r in rows) / total))
    return results


def _pct(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{100 * value:.1f}"


def _pm(mean: float, ci: float) -> str:
    return f"{_pct(mean)} ± {_pct(ci)}" if math.isfinite(ci) else f"{_pct(mean)} (1 seed)"


def summary_markdown(records: list[RunRecord]) -> str:
    if not records:
        raise ValueError("no run records to summarise")
    standard = standard_results(records)
    lines = [SUMMARY_TITLE, "",
             "Scores in percent. The learning rate is chosen on validation (mean over seeds); test is reported as "
             "mean ± 95 % CI (Student t) over seeds at that learning rate.", "",
             "## Per task", "", f"`steps`: optimizer steps per run; ⚠ marks runs of fewer than {FEW_STEPS}, whose "
             "scores say little about the model.", "",
             "| model | family | task | metric | best LR | validation | test | steps |" + standard_header(standard),
             "|---|---|---|---|---|---|---|---|" + "---|---|" * bool(standard)]
    for t in task_results(records):
        steps = f"{t.steps[0]}" if t.steps[0] == t.steps[1] else f"{t.steps[0]}–{t.steps[1]}"
        lines.append(f"| {t.model} | {t.family} | {t.task} | {t.metric} | {t.best_lr:g} | {_pct(t.validation_mean)} "
                     f"| {_pm(t.test_mean, t.test_ci95)} | {steps}{' ⚠' if t.steps[0] < FEW_STEPS else ''} |"
                     + standard_cells(standard, t))
    if standard:
        lines += ["", "`metric`/`test`: EncodEval's score (the paper's, compared with its released results); "
                  "`standard`: the family's usual metric from the same runs (QA: a SQuAD span model fine-tuned "
                  "beside the tagger), its LR chosen on its own validation."]
    lines += ["", "## Per family", "", "Mean over the family's tasks per seed, then mean ± 95 % CI over seeds.", "",
              "| model | family | tasks | seeds | test |", "|---|---|---|---|---|"]
    for f in family_results(records):
        lines.append(f"| {f.model} | {f.family} | {', '.join(f.tasks)} | {f.seeds} | {_pm(f.test_mean, f.test_ci95)} |")
    lines += ["", "## Stability", "",
              "Test-score spread: std over seeds at the chosen LR, std over every (LR, seed) run, best minus worst "
              "run, and the share of diverged runs (non-finite loss, or final loss above 1.5x the first). "
              "`(all)` rows average the per-task values of a model.", "",
              "| model | task | runs | std seeds | std all runs | worst→best gap | diverged |",
              "|---|---|---|---|---|---|---|"]
    for s in stability_results(records):
        lines.append(f"| {s.model} | {s.task} | {s.runs} | {_pct(s.std_over_seeds)} | {_pct(s.std_over_runs)} | "
                     f"{_pct(s.worst_to_best_gap)} | {100 * s.diverged_fraction:.0f} % |")
    lines += data_lines(records)
    return "\n".join(lines) + "\n"


def standard_header(standard: dict) -> str:
    return " standard metric | standard test |" if standard else ""


def standard_cells(standard: dict, result: TaskResult) -> str:
    if not standard:
        return ""
    other = standard.get((result.model, result.task))
    return " — | — |" if other is None else f" {other.metric} | {_pm(other.test_mean, other.test_ci95)} |"


def data_lines(records: list[RunRecord]) -> list[str]:
    """Where each task's rows came from (repository@revision, "unpinned" where no commit is pinned) and how many
    each source split held, as the run records carry them."""
    seen: dict[str, dict] = {}
    for record in records:
        if record.extra.get("data"):
            seen.setdefault(record.task, record.extra["data"])
    if not seen:
        return []
    lines = ["", "## Data", "", "| task | part | source | rows |", "|---|---|---|---|"]
    for task, parts in sorted(seen.items()):
        for part, info in parts.items():
            rows = info.get("rows", info.get("documents"))
            lines.append(f"| {task} | {part} | {info.get('origin', '(documents, id-keyed)')} | {rows} |")
    return lines


SUMMARY_TITLE = "# Downstream evaluation"
SUMMARY_KEYS = {"tasks", "families", "stability", "standard"}


def _written_by_us(path: Path) -> bool:
    """A summary file as `write_summary` writes it: the Markdown under its title, the JSON with its four sections."""
    try:
        text = read_regular_text(path, what="summary")
        if path.suffix == ".md":
            return text.startswith(SUMMARY_TITLE + "\n")
        data = json.loads(text)
        return isinstance(data, dict) and set(data) == SUMMARY_KEYS
    except ValueError:  # refused (a FIFO, too large) or not JSON: not ours
        return False


def check_summary_replaceable(output_dir: Path) -> None:
    """Refuse (FileExistsError, one line) when `output_dir` holds a summary.md or summary.json that `write_summary`
    did not write: someone's file of that name would be replaced. The CLI checks before the grid starts and takes
    `--force` to replace them."""
    for name in ("summary.md", "summary.json"):
        path = Path(output_dir) / name
        if (path.exists() or path.is_symlink()) and not _written_by_us(path):
            raise FileExistsError(f"{path} exists and is not a summary this tool wrote: pass --force to replace it, "
                                  f"or choose another --output")


def write_summary(records: list[RunRecord], output_dir: Path, force: bool = False) -> Path:
    """Write `summary.md` and `summary.json` under `output_dir`; returns the Markdown path. Existing ones are
    replaced when this tool wrote them (or `force`)."""
    output_dir = Path(output_dir)
    if not force:
        check_summary_replaceable(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    markdown_path = output_dir / "summary.md"
    write_atomic(markdown_path, summary_markdown(records))
    write_json_atomic(output_dir / "summary.json", finite_or_null({
        "tasks": [asdict(t) for t in task_results(records)],
        "families": [asdict(f) for f in family_results(records)],
        "stability": [asdict(s) for s in stability_results(records)],
        "standard": [asdict(t) for t in standard_results(records).values()],
    }), allow_nan=False)
    return markdown_path


def finite_or_null(value):
    """`value` with every NaN/±inf float replaced by None: an undefined number (the CI of one seed, the spread of a
    task whose runs all failed) is `null` in JSON, which has no NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(item) for item in value]
    return value
