"""The detour's report: the domain's held-out MLM loss (the trainer's validation, at phase 2's mask ratio) of
the imported model (step 0), at the end of phase 1 and at the end, for the detour and its control — read from the
import's measurement and from the runs' latest checkpoints (their `validation` history) — and, once both exports
are evaluated (ROOT/eval, the evaluation's grid), the downstream scores beside the final loss: per task and the mean
over tasks, each a mean with its 95 % CI over the fine-tuning seeds (recipes/detour_scores.py)."""
from __future__ import annotations

import json
from pathlib import Path

from mlmclm.train import checkpoint_files as ckpt
from recipes.detour_scores import MEAN, read_scores, score_text, scores_json

MLM = "val/mlm/loss"
PLAN_FILE = "detour_plan.json"  # what `detour report` reads: the plan's steps
EVAL_DIR = "eval"  # ROOT/eval: the grid's output folder for both exports
RUNS = ("detour", "control")


def validations(run_dir: Path) -> dict[int, dict]:
    """step -> the held-out losses a run recorded (its latest checkpoint's history); {} before any checkpoint."""
    latest = ckpt.latest_checkpoint(Path(run_dir) / "checkpoints")
    if latest is None:
        return {}
    return {entry["step"]: entry for entry in ckpt.read_json(latest, ckpt.TRAIN_STATE).get("validation", [])}


def report_rows(root: Path, phase1_steps: int, total_steps: int) -> dict:
    """{"step0": loss, "detour": {"switch": loss, "end": loss}, "control": {...}}; None where not measured."""
    step0_file = Path(root) / "step0_held_out.json"
    step0 = json.loads(step0_file.read_text(encoding="utf-8")).get(MLM) if step0_file.exists() else None
    rows = {"step0": step0, "phase1_steps": phase1_steps, "total_steps": total_steps}
    for name in RUNS:
        history = validations(Path(root) / name)
        rows[name] = {"switch": history.get(phase1_steps, {}).get(MLM),
                      "end": history.get(total_steps, {}).get(MLM)}
    return rows


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}"


def report_table(rows: dict) -> str:
    """Markdown: one row per run, the three points as columns (step 0 is the same imported model for both)."""
    first, total = rows["phase1_steps"], rows["total_steps"]
    lines = [f"| run | step 0 (imported) | step {first} (end of phase 1) | step {total} (end) | "
             f"change from step 0 |", "|---|---|---|---|---|"]
    for name, what in (("detour", f"CLM {first} → MLM decay {total - first}"),
                       ("control", f"MLM {first} → MLM decay {total - first}")):
        end = rows[name]["end"]
        change = "—" if end is None or rows["step0"] is None else f"{end - rows['step0']:+.4f}"
        lines.append(f"| {name} ({what}) | {_cell(rows['step0'])} | {_cell(rows[name]['switch'])} | "
                     f"{_cell(end)} | {change} |")
    return "\n".join(lines) + "\n"


def downstream_table(rows: dict, scores: dict) -> str:
    """Markdown: one row per run, the final held-out MLM loss beside each task's score and the mean over tasks."""
    columns = [*scores["tasks"], MEAN]
    lines = ["| run | held-out MLM loss (end) | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
    for name in RUNS:
        cells = scores["runs"].get(name, {})
        lines.append(f"| {name} | {_cell(rows[name]['end'])} | "
                     + " | ".join(score_text(cells.get(column)) for column in columns) + " |")
    return "\n".join(lines) + "\n"


def write_report(root: Path, phase1_steps: int, total_steps: int) -> str:
    """The tables (the downstream one once ROOT/eval holds run records), also written to ROOT/report.md and
    ROOT/report.json."""
    rows = report_rows(root, phase1_steps, total_steps)
    text = "Held-out MLM loss on the domain's validation split\n\n" + report_table(rows)
    scores = read_scores(Path(root) / EVAL_DIR)
    if scores is not None:
        text += ("\nDownstream scores (percent; the evaluation's grid on both exports: per task the LR chosen on "
                 "validation, test as mean ± 95 % CI over the fine-tuning seeds; the mean over tasks per seed, then "
                 "over seeds)\n\n" + downstream_table(rows, scores))
        rows = {**rows, "downstream": scores_json(scores)}
    (Path(root) / "report.md").write_text(text, encoding="utf-8")
    (Path(root) / "report.json").write_text(json.dumps(rows, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return text


def report_task(root: str, source: str, phase1_steps: int, total_steps: int) -> None:
    """The family's last job (Slurm): the plan's steps where `detour report` reads them, then the report."""
    (Path(root) / PLAN_FILE).write_text(json.dumps({"source": source, "phase1_steps": phase1_steps,
                                                    "total_steps": total_steps}, indent=2) + "\n", encoding="utf-8")
    print(write_report(Path(root), phase1_steps, total_steps), end="")
