"""Reading the training loop's TensorBoard scalars (tag names: mlmclm/tensorboard_tags.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlmclm.tensorboard_tags import OBJECTIVES, TAG_TOKENS, canonical_tag, loss_tag

__all__ = ["OBJECTIVES", "TAG_TOKENS", "Scalars", "loss_tag", "read_scalars", "tokens_at"]


@dataclass
class Scalars:
    steps: np.ndarray
    values: np.ndarray


def read_scalars(log_dir: Path) -> dict[str, Scalars]:
    """All scalar series under `log_dir` (every events file below it), merged per canonical tag and sorted by step:
    a folder whose parent folder holds events too is a phase's folder, its tags read as `<phase>/<tag>`. Runs
    logged in older layouts (one folder; `train/clm/loss` or `clm/held_out_loss`) are read under today's tags."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_dir = Path(log_dir)
    event_dirs = sorted({p.parent for p in log_dir.rglob("events.out.tfevents.*")})
    if not event_dirs:
        raise FileNotFoundError(f"{log_dir}: no TensorBoard events files (events.out.tfevents.*) found below it")
    merged: dict[str, dict[int, float]] = {}
    for directory in event_dirs:
        phase_folder = directory.name if directory.parent in event_dirs else None
        accumulator = EventAccumulator(str(directory), size_guidance={"scalars": 0})  # 0 = keep every point
        accumulator.Reload()
        for tag in accumulator.Tags().get("scalars", []):
            series = merged.setdefault(canonical_tag(phase_folder, tag), {})
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
