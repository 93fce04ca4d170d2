"""What pretraining itself measured, beside the fine-tuning runs of an evaluation folder: `pretraining.json`.

The mini-replication (recipes/mini.py) writes it next to `runs/`: for each pretrained model (its label is the
evaluation's model label, `<run>-s<seed>`) the objective, schedule and parent, the held-out validation CLM and
MLM losses over steps (the run's `metrics.jsonl` keys `val/clm/loss`, `val/mlm/loss`) and its fill-mask scores on
held-back passages; plus the baselines' fill-mask scores. The paper report reads it to draw the figures over
pretraining seeds (mlmclm/eval/reports/seed_figures.py).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from mlmclm.atomic_write import write_atomic

PRETRAINING_FILE = "pretraining.json"
OBJECTIVES = ("MLM", "CLM", "biphasic", "CPT")


class PretrainingInputError(ValueError):
    """A malformed pretraining.json; the message names the file and the field."""


@dataclass(frozen=True)
class PretrainedModel:
    label: str  # the evaluation's model label, `<base>-s<seed>`
    base: str  # the run without its seed
    seed: int
    objective: str  # MLM, CLM, biphasic (CLM then MLM) or CPT (MLM continued from a decayed parent)
    total_steps: int  # of its own schedule (a CPT run: its continued steps)
    clm_steps: int  # CLM steps before MLM: 0 for MLM and CPT, total_steps for CLM
    parent_objective: str | None  # a CPT run's parent: MLM or CLM
    validation: tuple[tuple[int, float, float], ...]  # (step, val CLM loss, val MLM loss), whole history
    fill_mask_loss: float
    fill_mask_top1: float
    variant: str | None = None  # beyond the paper's design, e.g. "mask 40 → 15 % linear": drawn apart from it

    @property
    def clm_share(self) -> float:
        return 100.0 * self.clm_steps / self.total_steps

    def final(self, objective: str) -> float:
        """The validation loss (`clm` or `mlm`) at the run's last step."""
        step, clm, mlm = self.validation[-1]
        return clm if objective == "clm" else mlm


def write_pretraining(directory: Path, measured: dict) -> Path:
    path = Path(directory) / PRETRAINING_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(measured, indent=1))
    return path


def _number(value, where: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise PretrainingInputError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def _model(raw, where: str) -> PretrainedModel:
    if not isinstance(raw, dict):
        raise PretrainingInputError(f"{where}: expected an object")
    for name, kind in (("label", str), ("base", str), ("seed", int), ("objective", str), ("total_steps", int),
                       ("clm_steps", int), ("validation", list), ("fill_mask", dict)):
        if not isinstance(raw.get(name), kind) or isinstance(raw.get(name), bool):
            raise PretrainingInputError(f"{where}: field '{name}' is missing or not a {kind.__name__}")
    if raw["objective"] not in OBJECTIVES:
        raise PretrainingInputError(f"{where}: objective {raw['objective']!r} is not one of {OBJECTIVES}")
    if not raw["validation"]:
        raise PretrainingInputError(f"{where}: no validation losses (validation: [])")
    curve = []
    for index, point in enumerate(raw["validation"]):
        if not isinstance(point, list) or len(point) != 3 or not isinstance(point[0], int):
            raise PretrainingInputError(f"{where}: validation[{index}] must be [step, val CLM, val MLM]")
        curve.append((point[0], _number(point[1], f"{where}.validation[{index}]"),
                      _number(point[2], f"{where}.validation[{index}]")))
    parent = raw.get("parent")
    variant = raw.get("variant")
    if variant is not None and not isinstance(variant, str):
        raise PretrainingInputError(f"{where}: field 'variant' must be a string or null, got {variant!r}")
    return PretrainedModel(raw["label"], raw["base"], raw["seed"], raw["objective"], raw["total_steps"],
                           raw["clm_steps"], parent.get("objective") if isinstance(parent, dict) else None,
                           tuple(sorted(curve)), _number(raw["fill_mask"].get("loss"), f"{where}.fill_mask.loss"),
                           _number(raw["fill_mask"].get("top1"), f"{where}.fill_mask.top1"), variant)


def load_pretraining(result_dirs: list[Path]) -> tuple[list[PretrainedModel], dict[str, dict[str, float]]]:
    """The pretrained models and the fill-mask baselines of every folder that has a pretraining.json (validated;
    none: empty)."""
    models: list[PretrainedModel] = []
    baselines: dict[str, dict[str, float]] = {}
    for directory in map(Path, result_dirs):
        path = directory / PRETRAINING_FILE
        if not path.exists():
            continue
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise PretrainingInputError(f"{path}: not readable JSON ({err})") from err
        if not isinstance(raw, dict) or not isinstance(raw.get("runs"), list):
            raise PretrainingInputError(f"{path}: expected an object with a 'runs' list")
        models += [_model(run, f"{path}: runs[{i}]") for i, run in enumerate(raw["runs"])]
        for name, scores in (raw.get("baselines") or {}).items():
            if isinstance(scores, dict):
                baselines[name] = {k: _number(scores.get(k), f"{path}: baselines.{name}.{k}") for k in ("loss", "top1")}
    labels = [m.label for m in models]
    if len(set(labels)) != len(labels):
        raise PretrainingInputError(f"the same model label twice in {PRETRAINING_FILE} files: "
                                    f"{sorted({x for x in labels if labels.count(x) > 1})}")
    return models, baselines
