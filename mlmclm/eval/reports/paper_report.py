"""The paper's outputs from evaluation folders (what `tools/evaluate.py` writes:
`runs/<model>/<task>/lr<lr>_seed<seed>.json`): the main table (models x SC/TC/QA/IR family means with 95 % CIs
over seeds, plus per-task columns, with the distance from the paper's numbers where recorded) and the figures of
`paper_figures`.

Only columns whose runs were all scored under EncodEval's rules (`extra.rules = "encodeval"`, the paper suite's)
get a distance from the paper's numbers or its released results: those are EncodEval's scores (encodeval_*.py), and
a standard run measures another quantity.

Selection and aggregation are `summary`'s (LR chosen on validation; family score = per-seed mean over the family's
tasks, then mean ± CI over seeds); this module only validates the inputs, arranges the table and writes the files.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from mlmclm.atomic_write import write_atomic
from mlmclm.eval.finetune.protocol import RUNS_FOLDER, RunRecord
from mlmclm.eval.finetune.task_spec import FAMILY_SHORT
from mlmclm.eval.reports.data_efficiency import CURVE_FILE
from mlmclm.eval.reports.paper_reference import PAPER_FACTS, PAPER_SCORES, ReferenceScore, reference_lookup
from mlmclm.eval.reports.pretraining_runs import PretrainedModel, PretrainingInputError, load_pretraining
from mlmclm.eval.reports.seed_groups import has_seed_groups, seed_csv, seed_markdown, seed_table
from mlmclm.eval.reports.summary import family_results, task_results

REPORT_FILE = "report.md"
TABLE_MD, TABLE_CSV = "main_table.md", "main_table.csv"
SEEDS_TABLE_MD, SEEDS_TABLE_CSV = "seeds_table.md", "seeds_table.csv"  # over pretraining seeds (seed_groups)
# Fields a run JSON must carry (those of RunRecord without a default), and the type each must have.
_REQUIRED = {"model": str, "task": str, "family": str, "main_metric": str, "learning_rate": (int, float),
             "seed": int, "validation": dict, "test": dict, "diverged": bool, "steps": int,
             "train_loss_first": (int, float), "train_loss_last": (int, float), "fingerprint": str}
# Numbers that may be undefined (a diverged run): NaN as json writes it, or null as strict JSON has it.
_MAY_BE_NULL = ("train_loss_first", "train_loss_last")


class ReportInputError(ValueError):
    """Missing or malformed evaluation results; the message names the path and field."""


@dataclass(frozen=True)
class Cell:
    mean: float
    ci95: float  # NaN with one seed
    reference: ReferenceScore | None = None

    @property
    def distance(self) -> float | None:
        """Ours minus the paper's, in percentage points."""
        return None if self.reference is None else 100 * self.mean - self.reference.value


@dataclass
class MainTable:
    models: list[str]
    families: list[str]  # short names present, in SC/TC/QA/IR order
    tasks: list[str]  # grouped by family
    task_family: dict[str, str]
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)  # (model, family short name or task) -> cell
    # (model, column) with a reference score but runs not scored under EncodEval's rules: left without a distance
    not_comparable: list[tuple[str, str]] = field(default_factory=list)


def _load_run(path: Path) -> RunRecord:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ReportInputError(f"{path}: not a readable run JSON ({err})") from err
    if not isinstance(raw, dict):
        raise ReportInputError(f"{path}: a run JSON must be an object, got {type(raw).__name__}")
    for name, kind in _REQUIRED.items():
        if name not in raw:
            raise ReportInputError(f"{path}: field '{name}' is missing")
        if raw[name] is None and name in _MAY_BE_NULL:
            raw[name] = float("nan")
        if not isinstance(raw[name], kind) or (kind is not bool and isinstance(raw[name], bool)):
            raise ReportInputError(f"{path}: field '{name}' has type {type(raw[name]).__name__}")
    if raw["family"] not in FAMILY_SHORT:
        raise ReportInputError(f"{path}: field 'family' is {raw['family']!r}; expected one of {sorted(FAMILY_SHORT)}")
    for split in ("validation", "test"):
        if raw["main_metric"] in raw[split] and raw[split][raw["main_metric"]] is None:
            continue  # an undefined score (null): the run counts as failed, as a NaN would
        value = raw[split].get(raw["main_metric"])
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ReportInputError(f"{path}: field '{split}' has no number for the main metric "
                                   f"'{raw['main_metric']}' (keys: {sorted(raw[split])})")
    if (raw["model"], raw["task"]) != (path.parent.parent.name, path.parent.name):
        raise ReportInputError(f"{path}: fields model/task ({raw['model']}/{raw['task']}) disagree with the path "
                               f"(runs/<model>/<task>/...)")
    return RunRecord(**{k: raw[k] for k in RunRecord.__dataclass_fields__ if k in raw})


def load_results(result_dirs: list[Path]) -> list[RunRecord]:
    """Every run JSON under each `DIR/runs/`, validated; the same (model, task, LR, seed) twice is an error."""
    if not result_dirs:
        raise ReportInputError("no results folder given")
    records: list[RunRecord] = []
    seen: dict[tuple, Path] = {}
    for directory in map(Path, result_dirs):
        runs = directory / RUNS_FOLDER
        if not runs.is_dir():
            raise ReportInputError(f"{directory}: no {RUNS_FOLDER}/ folder (expected tools/evaluate.py output: "
                                   f"{RUNS_FOLDER}/<model>/<task>/lr<lr>_seed<seed>.json)")
        paths = sorted(runs.glob("*/*/*.json"))
        if not paths:
            raise ReportInputError(f"{runs}: no run JSONs ({RUNS_FOLDER}/<model>/<task>/lr<lr>_seed<seed>.json)")
        for path in paths:
            record = _load_run(path)
            key = (record.model, record.task, record.learning_rate, record.seed)
            if key in seen:
                raise ReportInputError(f"{path}: run {key} also in {seen[key]}")
            seen[key] = path
            records.append(record)
    return records


def load_curves(result_dirs: list[Path]) -> dict[str, list[dict]]:
    """`curve.json` of each folder that has one (tools/evaluate.py curve), keyed by the folder's name."""
    curves = {}
    for directory in map(Path, result_dirs):
        path = directory / CURVE_FILE
        if not path.exists():
            continue
        try:
            points = json.loads(path.read_text(encoding="utf-8"))["points"]
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
            raise ReportInputError(f"{path}: not a data-efficiency curve ({err})") from err
        for index, point in enumerate(points):
            if not isinstance(point, dict) or not isinstance(point.get("iteration"), int) \
                    or not isinstance(point.get("family_scores"), dict):
                raise ReportInputError(f"{path}: points[{index}] needs an integer 'iteration' and a "
                                       f"'family_scores' object")
        curves[directory.name] = points
    return curves


def encodeval_columns(records: list[RunRecord]) -> set[tuple[str, str]]:
    """(model, column) whose every run was scored under EncodEval's rules (run records with extra.rules =
    "encodeval", what `--suite paper` writes): only those measure what the paper's numbers and its released results
    measure (its QA token-tagging F1, its nDCG over the retrieved ten, ...), so only those get a distance."""
    runs: dict[tuple[str, str], list[bool]] = {}
    for r in records:
        encodeval = r.extra.get("rules") == "encodeval"
        runs.setdefault((r.model, r.task), []).append(encodeval)
        runs.setdefault((r.model, FAMILY_SHORT[r.family]), []).append(encodeval)
    return {key for key, flags in runs.items() if all(flags)}


def main_table(records: list[RunRecord],
               reference: tuple[ReferenceScore, ...] = PAPER_SCORES) -> MainTable:
    if not records:
        raise ReportInputError("no run records")
    refs, comparable = reference_lookup(reference), encodeval_columns(records)
    per_task = task_results(records)
    task_family = {t.task: t.family for t in per_task}
    order = list(FAMILY_SHORT)
    table = MainTable(models=sorted({r.model for r in records}),
                      families=[FAMILY_SHORT[f] for f in order if f in task_family.values()],
                      tasks=sorted(task_family, key=lambda t: (order.index(task_family[t]), t)),
                      task_family=task_family)
    cells = [((t.model, t.task), t.test_mean, t.test_ci95) for t in per_task]
    cells += [((f.model, FAMILY_SHORT[f.family]), f.test_mean, f.test_ci95) for f in family_results(records)]
    for key, mean, ci in cells:
        if key in refs and key not in comparable:
            table.not_comparable.append(key)
        table.cells[key] = Cell(mean, ci, refs.get(key) if key in comparable else None)
    return table


def released_reference(root: Path, recorded: tuple[ReferenceScore, ...] = PAPER_SCORES) -> tuple[ReferenceScore, ...]:
    """Reference scores from the authors' released per-run results (`encodeval_results`), aggregated by the same
    rule as ours; a (model, column) the paper's printed numbers already give keeps the printed one."""
    from mlmclm.eval.reports.encodeval_results import EncodEvalFormatError, load_encodeval_results

    try:
        records = load_encodeval_results(root)
    except EncodEvalFormatError as err:
        raise ReportInputError(str(err)) from err
    taken = {(r.model, r.column) for r in recorded}
    source = f"authors' released runs ({root}), aggregated by mlmclm's rule"
    released = tuple(ReferenceScore(model, column, 100 * cell.mean, source)
                     for (model, column), cell in sorted(main_table(records, ()).cells.items())
                     if (model, column) not in taken and math.isfinite(cell.mean))
    return recorded + released


def _pct(cell: Cell | None) -> str:
    if cell is None or not math.isfinite(cell.mean):
        return "—"
    return f"{100 * cell.mean:.1f}" + (f" ± {100 * cell.ci95:.1f}" if math.isfinite(cell.ci95) else " (1 seed)")


def _distance(cell: Cell | None) -> str:
    if cell is None or cell.distance is None:
        return "—"
    return f"{cell.distance:+.1f} (paper {cell.reference.value:.1f})"


def table_markdown(table: MainTable) -> str:
    columns = table.families + table.tasks
    has_ref = any(c.reference is not None for c in table.cells.values())
    header = ["model"] + columns + ([f"Δ {c}" for c in columns] if has_ref else [])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for model in table.models:
        cells = [table.cells.get((model, c)) for c in columns]
        row = [model] + [_pct(c) for c in cells] + ([_distance(c) for c in cells] if has_ref else [])
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def table_csv(table: MainTable) -> str:
    """Fractions in [0, 1] (as in the run JSONs); `<col>_paper` in percent as printed, `<col>_distance_pp` in
    percentage points; empty where there is no value."""
    columns = table.families + table.tasks
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["model"] + [f"{c}_{s}" for c in columns for s in ("mean", "ci95", "paper", "distance_pp")])
    for model in table.models:
        row = [model]
        for column in columns:
            cell = table.cells.get((model, column))
            if cell is None:
                row += ["", "", "", ""]
                continue
            row += [repr(cell.mean), repr(cell.ci95) if math.isfinite(cell.ci95) else "",
                    "" if cell.reference is None else repr(cell.reference.value),
                    "" if cell.distance is None else repr(cell.distance)]
        writer.writerow(row)
    return out.getvalue()


def _write(path: Path, text: str) -> None:
    write_atomic(path, text)


def _check_output(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ReportInputError(f"--out {out} exists and is not a folder")
    existing = [name for name in (REPORT_FILE, TABLE_MD, TABLE_CSV, SEEDS_TABLE_MD, SEEDS_TABLE_CSV)
                if (out / name).exists()]
    if existing and not force:
        raise ReportInputError(f"{out} already holds a report ({', '.join(existing)}); pass --force to overwrite")


def write_report(result_dirs: list[Path], out: Path, force: bool = False,
                 reference: tuple[ReferenceScore, ...] = PAPER_SCORES, grid=None) -> Path:
    """Validate the inputs, then write the table (Markdown + CSV), the figures that have data and `report.md`;
    with models of several pretraining seeds (labels `<run>-s<seed>`, or a `pretraining.json`) also the table and
    figures over pretraining seeds. `grid` (a `paper_figures.PaperGrid`, `recipes/grid.py: paper_catalogue()`) says
    which labels are the paper's runs. Nothing is written when an input is bad or `out` already holds a report
    (unless `force`)."""
    from mlmclm.eval.reports import paper_figures  # matplotlib only when a report is actually written

    out = Path(out)
    _check_output(out, force)
    records = load_results(result_dirs)
    curves = load_curves(result_dirs)
    try:
        pretrained, baselines = load_pretraining(result_dirs)
    except PretrainingInputError as err:
        raise ReportInputError(str(err)) from err
    table = main_table(records, reference)
    out.mkdir(parents=True, exist_ok=True)
    figures = paper_figures.write_figures(records, curves, out, grid)
    seeds_section = _write_seed_outputs(records, pretrained, baselines, out)
    markdown = table_markdown(table)
    _write(out / TABLE_MD, markdown)
    _write(out / TABLE_CSV, table_csv(table))
    lines = ["# Paper report", "",
             "Scores in percent: test mean ± 95 % CI (Student t) over seeds, each task at the learning rate chosen "
             "on validation; a family score is the per-seed mean over the family's tasks, then mean ± CI over "
             "seeds. Inputs: " + ", ".join(str(d) for d in result_dirs) + ".", "", "## Main table", "", markdown]
    sources = sorted({c.reference.source for c in table.cells.values() if c.reference is not None})
    if table.not_comparable:
        lines += [f"No distance for {len(table.not_comparable)} cell(s) with a reference score ("
                  + ", ".join(f"{m}/{c}" for m, c in table.not_comparable[:6])
                  + (", ..." if len(table.not_comparable) > 6 else "") + "): their runs were not scored under "
                  "EncodEval's rules (run records without `extra.rules = \"encodeval\"`: custom suites, or paper runs "
                  "from before those rules), so they do not measure what the paper's numbers measure.", ""]
    if sources:
        lines += ["Distance (Δ, percentage points, ours − reference) from: " + "; ".join(sources) + ".", ""]
    elif not table.not_comparable:
        lines += ["No distance from the paper: `mlmclm/eval/reports/paper_reference.py` records no score of the "
                  "paper for these models and columns (see its docstring for why and how to add them), and no released "
                  "results were given (`--reference-encodeval`).", ""]
    lines += seeds_section
    lines += ["## Figures", ""]
    for name, note in figures.items():
        lines.append(f"* `{name}`: {note}")
    lines += ["", "## The paper's setup (as recorded in paper_reference.py)", ""]
    lines += [f"* {fact.what}: {fact.value} ({fact.source})" for fact in PAPER_FACTS]
    report = out / REPORT_FILE
    _write(report, "\n".join(lines) + "\n")
    return report


def _write_seed_outputs(records: list[RunRecord], pretrained: list[PretrainedModel],
                        baselines: dict[str, dict[str, float]], out: Path) -> list[str]:
    """The table and figures over pretraining seeds when there is more than one seed or a pretraining.json (else
    any stale ones are removed); returns report.md's section on them."""
    from mlmclm.eval.reports import seed_figures

    if not pretrained and not has_seed_groups(r.model for r in records):
        for name in (SEEDS_TABLE_MD, SEEDS_TABLE_CSV, seed_figures.SPLIT_PNG, seed_figures.CPT_PNG,
                     seed_figures.CURVES_PNG):
            (out / name).unlink(missing_ok=True)
        return []
    table = seed_table(records, pretrained)
    markdown = seed_markdown(table)
    _write(out / SEEDS_TABLE_MD, markdown)
    _write(out / SEEDS_TABLE_CSV, seed_csv(table))
    notes = seed_figures.write_seed_figures(pretrained, table, out)
    lines = ["## Over pretraining seeds", "",
             "Labels `<run>-s<seed>` are one run pretrained with different seeds: each column is the mean ± 95 % CI "
             "(Student t) over those seeds of the per-seed value (a fine-tuning score: mean over fine-tuning seeds at "
             "the LR chosen on validation; validation losses at the run's last step; fill-mask top-1 on held-back "
             "passages). Losses in nats (lower is better), scores in percent.", "", markdown]
    if baselines:
        lines += ["Fill-mask baselines: " + "; ".join(f"{name} top-1 {100 * b['top1']:.1f} %, loss {b['loss']:.2f}"
                                                      for name, b in sorted(baselines.items())) + ".", ""]
    lines += [f"* `{name}`: {note}" for name, note in notes.items()] + [""]
    return lines
