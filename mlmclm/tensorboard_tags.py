"""TensorBoard's names for the trainer's metrics, in one place for the writer (mlmclm/train/logger.py) and the
readers (mlmclm/eval/tensorboard_logs.py).

`metrics.jsonl` keeps the trainer's own keys (`train/clm/loss`, `val/mlm/loss`, `perf/tokens_per_s`, ...): scripts
and tests read those. TensorBoard gets names chosen for its Time Series view, which opens on tag groups (the part
before the first '/') in alphabetical order: grouping by objective puts the loss and accuracy curves first, training
and held-out side by side (`clm/loss`, `clm/held_out_loss`, ...), then `optimisation/`, `performance/`, `progress/`.
"""
from __future__ import annotations

OBJECTIVES = ("clm", "mlm")

# Fixed keys of metrics.jsonl and their TensorBoard names; per-objective keys are mapped by `tensorboard_tag`.
_FIXED = {
    "train/lr": "optimisation/lr",
    "train/grad_norm": "optimisation/grad_norm",
    "train/skipped": "optimisation/skipped_step",
    "train/tokens": "progress/tokens",
    "train/phase": "progress/phase",
}


def tensorboard_tag(key: str) -> str:
    """The TensorBoard tag of a metrics.jsonl key; names that are already tags (or unknown) pass through, so a reader
    may apply it to the tags of runs logged before this naming too."""
    if key in _FIXED:
        return _FIXED[key]
    parts = key.split("/")
    if len(parts) == 3 and parts[0] in ("train", "val") and parts[2] in ("loss", "accuracy"):
        return f"{parts[1]}/{parts[2]}" if parts[0] == "train" else f"{parts[1]}/held_out_{parts[2]}"
    if parts[0] == "perf" and len(parts) == 2:
        return f"performance/{parts[1]}"
    return key


def loss_tag(objective: str) -> str:
    """Training loss of an objective."""
    return tensorboard_tag(f"train/{objective}/loss")


TAG_TOKENS = tensorboard_tag("train/tokens")
