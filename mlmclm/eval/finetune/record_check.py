"""A run record read back (`runs/<model>/<task>/lr…_seed….json`) is checked field by field before it is used.

Run records are reused by `grid`, summarised by `summary`, compared by the reports: files that may have been
edited, copied from elsewhere or damaged. One that is not an object, lacks a field or holds one of the wrong type
gave a TypeError or AttributeError deep in the summary; here it is a RunRecordError (a ValueError) naming the file
and the field: one line, exit 2 from `tools/evaluate.py`.
"""
from __future__ import annotations

import math
from pathlib import Path

from mlmclm.eval.finetune.task_spec import FAMILIES


class RunRecordError(ValueError):
    """A run record that is not what `run_grid` writes."""


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scores(value) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and (v is None or _number(v)) for k, v in value.items())


# field -> (what it must be, the check); the optional ones may be absent
_REQUIRED = {
    "model": ("a string", lambda v: isinstance(v, str)),
    "task": ("a string", lambda v: isinstance(v, str)),
    "family": (f"one of {FAMILIES}", lambda v: v in FAMILIES),
    "main_metric": ("a string", lambda v: isinstance(v, str)),
    "learning_rate": ("a finite number > 0", lambda v: _number(v) and math.isfinite(v) and v > 0),
    "seed": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "validation": ("an object of metric -> number", _scores),
    "test": ("an object of metric -> number", _scores),
    "diverged": ("true or false", lambda v: isinstance(v, bool)),
    "steps": ("an integer >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
    "train_loss_first": ("a number", _number),
    "train_loss_last": ("a number", _number),
    "fingerprint": ("a string", lambda v: isinstance(v, str)),
}
_OPTIONAL = {
    "model_dir": ("a string", lambda v: isinstance(v, str)),
    "seconds": ("a number", _number),
    "extra": ("an object", lambda v: isinstance(v, dict)),
}
_EXTRA = {
    "notes": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v)),
    "data": ("an object of part -> object", lambda v: isinstance(v, dict) and all(isinstance(p, dict)
                                                                                for p in v.values())),
    "rules": ("a string", lambda v: isinstance(v, str)),
    "trained_on": ("a string", lambda v: isinstance(v, str)),
}


def check_record(raw, path: Path) -> dict:
    """`raw` (a record's parsed JSON) if every field the code reads is there with its type; else RunRecordError."""
    if not isinstance(raw, dict):
        raise RunRecordError(f"{path}: not a run record: expected a JSON object, got {type(raw).__name__}")
    for fields, required in ((_REQUIRED, True), (_OPTIONAL, False)):
        for name, (what, ok) in fields.items():
            if name not in raw:
                if required:
                    raise RunRecordError(f"{path}: not a run record: no field {name!r}")
                continue
            if not ok(raw[name]):
                raise RunRecordError(f"{path}: field {name!r} must be {what}, got {raw[name]!r:.80}")
    for name, (what, ok) in _EXTRA.items():
        extra = raw.get("extra", {})
        if name in extra and not ok(extra[name]):
            raise RunRecordError(f"{path}: field 'extra.{name}' must be {what}, got {extra[name]!r:.80}")
    return raw
