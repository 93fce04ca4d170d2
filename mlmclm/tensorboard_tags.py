"""TensorBoard's names for the trainer's metrics, in one place for the writer (mlmclm/train/logger.py) and the
readers (mlmclm/eval/reports/tensorboard_logs.py).

`metrics.jsonl` keeps the trainer's own keys (`train/clm/loss`, `val/mlm/loss`, `perf/tokens_per_s`, ...): scripts
and tests read those. TensorBoard gets a layout chosen for what it draws:

- The run's events lie in `RUN/tensorboard/NAME/` (NAME: `logging.run_name`, by default the run directory's
  name), so `tensorboard --logdir RUN/tensorboard` calls the run NAME. Events directly in the folder given to
  TensorBoard are a run called "." (or "mine/." under `--logdir_spec mine:...`).
- Each phase's curves lie one level below, in `NAME/<phase>/` (and the held-out losses in `NAME/clm/`,
  `NAME/mlm/`), under the same tags: `loss`, `loss_held_out`, `token_accuracy`, `token_accuracy_held_out`.
  TensorBoard colours by run, never by tag, so this is what gives CLM and MLM their own colour on one chart
  (Time Series overlays the runs of a tag; Custom Scalars gives every run its colour and every tag of one run
  only another marker).
- Time Series opens on tag groups in alphabetical order: `loss`, `loss_held_out` come first, then
  `optimisation/`, `performance/`, `progress/`, and the accuracies last.

Readers see one flat namespace, the canonical tags (`clm/loss`, `clm/loss_held_out`, `clm/token_accuracy`,
`optimisation/lr`, ...): `canonical_tag` maps a (phase folder, tag) pair, or a tag of an older run's layout, to it.
"""
from __future__ import annotations

OBJECTIVES = ("clm", "mlm")

# Fixed keys of metrics.jsonl and their TensorBoard names; per-phase keys are mapped by `tensorboard_tag`.
_FIXED = {
    "train/lr": "optimisation/lr",
    "train/grad_norm": "optimisation/grad_norm",
    "train/skipped": "optimisation/skipped_step",
    "train/tokens": "progress/tokens",
    "train/phase": "progress/phase",
    "train/mask_ratio": "progress/mask_ratio",                   # MLM steps: the schedule's rate
    "train/mask_ratio_realised": "progress/mask_ratio_realised",  # ... and what the step's masks realised
    "train/rope_theta": "progress/rope_theta",                   # the RoPE base in force (a phase may raise it)
    "train/context_length": "progress/context_length",           # the longest sample a step trains on
}

# Per-phase metrics: (split, metric) of `train|val/<phase>/<metric>` -> the tag inside the phase's run folder.
_PHASE_TAGS = {
    ("train", "loss"): "loss",
    ("val", "loss"): "loss_held_out",
    ("train", "accuracy"): "token_accuracy",
    ("val", "accuracy"): "token_accuracy_held_out",
}

# Tags older runs wrote inside one run folder (until 2026-12): read under today's canonical names.
_OLDER = {"accuracy": "token_accuracy", "held_out_loss": "loss_held_out", "held_out_accuracy": "token_accuracy_held_out"}


def phase_location(key: str) -> tuple[str, str] | None:
    """(phase folder, tag) of a per-phase metrics.jsonl key (`train/clm/loss` -> ("clm", "loss")), else None."""
    parts = key.split("/")
    if len(parts) == 3 and (parts[0], parts[2]) in _PHASE_TAGS:
        return parts[1], _PHASE_TAGS[parts[0], parts[2]]
    return None


def phase_tag(split: str, metric: str) -> str:
    """The tag, inside a phase's run folder, of `split` ("train" or "val") and `metric` ("loss" or "accuracy")."""
    return _PHASE_TAGS[split, metric]


def tensorboard_tag(key: str) -> str:
    """The canonical tag of a metrics.jsonl key; names that are already tags (or unknown) pass through, and tags
    of older runs are renamed, so a reader may apply it to any run's tags."""
    if key in _FIXED:
        return _FIXED[key]
    located = phase_location(key)
    if located is not None:
        return "/".join(located)
    parts = key.split("/")
    if parts[0] == "perf" and len(parts) == 2:
        return f"performance/{parts[1]}"
    if len(parts) == 2 and parts[1] in _OLDER:
        return f"{parts[0]}/{_OLDER[parts[1]]}"
    return key


def canonical_tag(phase_folder: str | None, tag: str) -> str:
    """The canonical tag of `tag` as found in a phase's run folder (None: the run's own folder, or an older
    layout's only folder)."""
    return tensorboard_tag(tag if phase_folder is None else f"{phase_folder}/{tag}")


def loss_tag(objective: str) -> str:
    """Training loss of an objective (canonical)."""
    return tensorboard_tag(f"train/{objective}/loss")


TAG_TOKENS = tensorboard_tag("train/tokens")
