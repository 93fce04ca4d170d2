"""Reading the training loop's TensorBoard scalars. The tag names the trainer writes live here, in one place."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

OBJECTIVES = ("clm", "mlm")
TAG_TOKENS = "train/tokens"
TAG_LR = "train/lr"


def loss_tag(objective: str) -> str:
    return f"train/{objective}/loss"


def accuracy_tag(objective: str) -> str:
    return f"train/{objective}/accuracy"


@dataclass
class Scalars:
    steps: np.ndarray
    values: np.ndarray


def read_scalars(log_dir: Path) -> dict[str, Scalars]:
    """All scalar series under `log_dir` (every events file below it), merged per tag and sorted by step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_dir = Path(log_dir)
    event_dirs = sorted({p.parent for p in log_dir.rglob("events.out.tfevents.*")})
    if not event_dirs:
        raise FileNotFoundError(f"{log_dir}: no TensorBoard events files (events.out.tfevents.*) found below it")
    merged: dict[str, dict[int, float]] = {}
    for directory in event_dirs:
        accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0})  # 0 = keep every point
        accumulator.Reload()
        for tag in accumulator.Tags().get("scalars", []):
            series = merged.setdefault(tag, {})
            for event in accumulator.Scalars(tag):
                series[event.step] = event.value  # a resumed run re-logs steps: the later file wins
    out = {}
    for tag, series in merged.items():
        steps = np.array(sorted(series), dtype=np.int64)
        out[tag] = Scalars(steps=steps, values=np.array([series[s] for s in steps], dtype=float))
    return out


def tokens_at(scalars: dict[str, Scalars], steps: np.ndarray) -> np.ndarray | None:
    """Consumed tokens at the given steps (linear interpolation of `train/tokens`), or None when not logged."""
    tokens = scalars.get(TAG_TOKENS)
    if tokens is None or tokens.steps.size == 0:
        return None
    return np.interp(steps, tokens.steps, tokens.values)
