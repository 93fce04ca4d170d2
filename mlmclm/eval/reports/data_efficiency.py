"""Data efficiency: export each intermediate checkpoint of a training run to HF format, evaluate it, and record
downstream score vs pretraining iteration / consumed tokens (labelled by objective phase)."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlmclm.bounded_read import read_regular_json
from mlmclm.eval.finetune.protocol import ProtocolConfig, write_json_atomic
from mlmclm.eval.finetune.task_loading import load_task
from mlmclm.eval.finetune.task_spec import TaskData, TaskSpec
from mlmclm.eval.grid.run import run_grid
from mlmclm.eval.reports.summary import family_results, task_results

_ITER_DIR = re.compile(r"^iter_(\d{7})$")
CURVE_FILE = "curve.json"

Exporter = Callable[[Path, Path], Path]


def _default_exporter(checkpoint_dir: Path, output_dir: Path) -> Path:
    from mlmclm.convert.to_hf import export_checkpoint  # imported late: the converter lands separately

    return export_checkpoint(checkpoint_dir, output_dir)


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    iteration: int
    consumed_tokens: int | None
    phase_name: str | None
    phase_index: int | None


def _train_state(checkpoint_dir: Path) -> dict[str, Any]:
    """The checkpoint's `train_state.json` (iteration, tokens, phase), or {} when missing/unreadable. Read bounded:
    a FIFO or device planted in a run folder is refused naming it (a plain read blocked `curve` forever)."""
    path = checkpoint_dir / "train_state.json"
    try:
        state = read_regular_json(path, what="train state")
    except (FileNotFoundError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return state if isinstance(state, dict) else {}


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def list_checkpoints(run_dir: Path) -> list[CheckpointInfo]:
    """`RUN/checkpoints/iter_NNNNNNN` folders sorted by iteration (the folder name wins if run_config disagrees)."""
    folder = Path(run_dir) / "checkpoints"
    if not folder.is_dir():
        raise FileNotFoundError(f"{run_dir}: no checkpoints/ folder (expected RUN/checkpoints/iter_0000100/ ...)")
    found = []
    for child in sorted(folder.iterdir()):
        match = _ITER_DIR.match(child.name)
        if not (match and child.is_dir()):
            continue
        state = _train_state(child)
        phase = state.get("phase_name")
        found.append(CheckpointInfo(path=child, iteration=int(match.group(1)),
                                    consumed_tokens=_int_or_none(state.get("consumed_tokens")),
                                    phase_name=phase if isinstance(phase, str) else None,
                                    phase_index=_int_or_none(state.get("phase_index"))))
    if not found:
        raise FileNotFoundError(f"{folder}: no iter_NNNNNNN checkpoint folders")
    return sorted(found, key=lambda c: c.iteration)


def evaluate_checkpoints(run_dir: Path, tasks: list[TaskSpec], output_dir: Path, protocol: ProtocolConfig,
                         exporter: Exporter | None = None, every: int = 1, progress: bool = True) -> Path:
    """Export + evaluate every `every`-th checkpoint (the last one always); write `output_dir/curve.json`.
    Exports go to `output_dir/exported/iter_*` and are reused when present; finished runs are skipped."""
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    exporter = exporter or _default_exporter
    output_dir = Path(output_dir)
    checkpoints = list_checkpoints(run_dir)
    chosen = [c for i, c in enumerate(checkpoints) if i % every == 0 or i == len(checkpoints) - 1]
    loaded: list[TaskData] = [load_task(t) for t in tasks]
    points = []
    for checkpoint in chosen:
        label = checkpoint.path.name
        export_dir = output_dir / "exported" / label
        if not (export_dir / "config.json").exists():
            export_dir = Path(exporter(checkpoint.path, export_dir))
        records = run_grid({label: export_dir}, loaded, output_dir, protocol, progress=progress)
        scores = {t.task: t.test_mean for t in task_results(records)}
        families = {f.family: f.test_mean for f in family_results(records)}
        points.append({**{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(checkpoint).items()},
                       "label": label, "task_scores": scores, "family_scores": families,
                       "mean_score": float(np.mean(list(scores.values())))})
    curve_path = output_dir / CURVE_FILE
    write_json_atomic(curve_path, {"run_dir": str(run_dir), "points": points})
    return curve_path


def read_curve(path: Path) -> list[dict[str, Any]]:
    try:
        raw = read_regular_json(path, what="curve file")
        return list(raw["points"])
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a data-efficiency curve file ({err})") from err
