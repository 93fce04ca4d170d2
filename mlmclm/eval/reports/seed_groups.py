"""Results over pretraining seeds: model labels `<run>-s<seed>` are one run pretrained with different seeds, and
this module groups them — mean and 95 % CI (Student t) over the seeds of each run's per-seed score.

A label without the suffix (every paper-grid name, `610m-mlm40-42k-1000` included) is a group of its own with one
seed. Per seed, a task score is the mean over fine-tuning seeds at the LR chosen on validation and a family score
the mean over the family's tasks (`summary`'s rule); pretraining measurements (validation losses at the last step,
fill-mask) come from `pretraining.json` (mlmclm/eval/reports/pretraining_runs.py).
"""
from __future__ import annotations

import csv
import io
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field

from mlmclm.eval.finetune.metrics import mean_ci95
from mlmclm.eval.finetune.protocol import RunRecord
from mlmclm.eval.finetune.task_spec import FAMILY_SHORT
from mlmclm.eval.reports.pretraining_runs import PretrainedModel
from mlmclm.eval.reports.summary import family_results, task_results

SEED_SUFFIX = re.compile(r"^(?P<base>.+)-s(?P<seed>\d+)$")
# Pretraining columns: (column, what, lower is better)
PRETRAINING_COLUMNS = (("val CLM", "validation CLM loss at the last step (nats)", True),
                       ("val MLM", "validation MLM-40 % loss at the last step (nats)", True),
                       ("fill-mask top-1", "fill-mask top-1 accuracy on held-back passages (%)", False))


def split_seed(label: str) -> tuple[str, int | None]:
    """(`<run>`, seed) for `<run>-s<seed>`; (label, None) otherwise."""
    match = SEED_SUFFIX.match(label)
    return (match["base"], int(match["seed"])) if match else (label, None)


@dataclass(frozen=True)
class SeedCell:
    mean: float
    ci95: float  # NaN with one seed
    seeds: int

    @classmethod
    def of(cls, values: list[float]) -> SeedCell:
        mean, ci = mean_ci95(values)
        return cls(mean, ci, len(values))


@dataclass
class SeedTable:
    runs: list[str]  # bases, in the order given
    columns: list[str]  # pretraining columns present, then family short names, then tasks
    percent: set[str]  # columns shown in percent
    seeds: dict[str, list[int]] = field(default_factory=dict)  # base -> the seeds it has (none: unsuffixed label)
    cells: dict[tuple[str, str], SeedCell] = field(default_factory=dict)


def _per_seed(records: list[RunRecord], models: list[PretrainedModel]) -> dict[str, dict[str, float]]:
    """label -> column -> that label's value (fractions for scores)."""
    values: dict[str, dict[str, float]] = defaultdict(dict)
    for m in models:
        values[m.label].update({"val CLM": m.final("clm"), "val MLM": m.final("mlm"),
                                "fill-mask top-1": m.fill_mask_top1})
    if records:
        for t in task_results(records):
            values[t.model][t.task] = t.test_mean
        for f in family_results(records):
            values[f.model][FAMILY_SHORT[f.family]] = f.test_mean
    return values


def seed_table(records: list[RunRecord], models: list[PretrainedModel]) -> SeedTable:
    """One row per run (labels grouped by their `-s<seed>` suffix), each column's mean ± CI over its seeds."""
    values = _per_seed(records, models)
    order = [m.label for m in models] + sorted({r.model for r in records} - {m.label for m in models})
    groups: dict[str, dict[int | None, str]] = {}
    for label in order:
        base, seed = split_seed(label)
        groups.setdefault(base, {})[seed] = label
    families = [f for f in FAMILY_SHORT.values() if any(f in v for v in values.values())]
    tasks = sorted({t.task: FAMILY_SHORT[t.family] for t in task_results(records)}.items(),
                   key=lambda item: (list(FAMILY_SHORT.values()).index(item[1]), item[0])) if records else []
    pretraining = [c for c, _, _ in PRETRAINING_COLUMNS if any(c in v for v in values.values())]
    table = SeedTable(runs=list(groups), columns=pretraining + families + [t for t, _ in tasks],
                      percent={"fill-mask top-1", *families, *(t for t, _ in tasks)})
    for base, labels in groups.items():
        table.seeds[base] = sorted(s for s in labels if s is not None)
        for column in table.columns:
            found = [values[label][column] for label in labels.values() if column in values[label]]
            finite = [v for v in found if math.isfinite(v)]
            if finite:
                table.cells[(base, column)] = SeedCell.of(finite)
    return table


def _show(cell: SeedCell | None, percent: bool) -> str:
    if cell is None:
        return "—"
    scale, digits = (100, 1) if percent else (1, 3)
    text = f"{scale * cell.mean:.{digits}f}"
    return text + (f" ± {scale * cell.ci95:.{digits}f}" if math.isfinite(cell.ci95) else "")


def seed_markdown(table: SeedTable) -> str:
    header = ["run", "seeds"] + table.columns
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for base in table.runs:
        seeds = table.seeds[base]
        row = [base, str(len(seeds)) if seeds else "1 (no -s suffix)"]
        row += [_show(table.cells.get((base, c)), c in table.percent) for c in table.columns]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def seed_csv(table: SeedTable) -> str:
    """Raw values (fractions for scores, nats for losses): `<col>_mean`, `<col>_ci95` (empty with one seed),
    `<col>_seeds`."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["run", "seeds"] + [f"{c}_{s}" for c in table.columns for s in ("mean", "ci95", "seeds")])
    for base in table.runs:
        row = [base, " ".join(map(str, table.seeds[base]))]
        for column in table.columns:
            cell = table.cells.get((base, column))
            row += ["", "", ""] if cell is None else [repr(cell.mean), repr(cell.ci95) if math.isfinite(cell.ci95)
                                                     else "", cell.seeds]
        writer.writerow(row)
    return out.getvalue()


def has_seed_groups(labels) -> bool:
    """Whether any label carries a `-s<seed>` suffix (then the report adds the table over pretraining seeds)."""
    return any(split_seed(label)[1] is not None for label in labels)
