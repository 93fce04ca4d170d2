"""The authors' released per-run results (EncodEval, branch MLM_vs_CLM, `results/`) read as our run records, so
the paper report can put the paper's own runs beside ours, aggregated by the same rule.

Layout, as released: `results/<model>/<SC|TC|QA|IR>/<task>/[<train task>_]lr<lr>_sd<seed>/results.json`, each
holding `{"validation": {"score": ...}, "test": {"score": ...}}` (plus per-example scores, ignored). Retrieval runs
are named after the set they were trained on (`msmarco_pairs_lr1e-04_sd0` under `IR/nq/`). Some grid points are
absent in the release (e.g. runs that did not finish); they are simply missing here too.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

from mlmclm.eval.finetune.protocol import RunRecord

FAMILIES = {"SC": "classification", "TC": "token_classification", "QA": "qa", "IR": "retrieval"}
# EncodEval's task folder names where ours (mlmclm/eval/finetune/presets.py) differ.
TASK_NAMES = {"mnli_m": "mnli", "conll2003_en": "conll2003", "ontonotes": "ontonotes5"}
_RUN_DIR = re.compile(r"^(?:(?P<train>.+)_)?lr(?P<lr>[0-9.e+-]+)_sd(?P<seed>\d+)$")


class EncodEvalFormatError(ValueError):
    """A released results file or folder that does not follow the layout above; names the path."""


def _score(path: Path, raw: dict, split: str) -> float:
    value = raw.get(split, {}).get("score") if isinstance(raw.get(split), dict) else None
    if value is None:
        return float("nan")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise EncodEvalFormatError(f"{path}: '{split}.score' is not a number")
    return float(value)


def load_encodeval_results(root: Path) -> list[RunRecord]:
    """Every `results.json` under `root` (the release's `results/` folder) as a RunRecord with main metric
    `score`; a run with no finite test score counts as diverged."""
    root = Path(root)
    if not root.is_dir():
        raise EncodEvalFormatError(f"{root}: not a folder (expected EncodEval's results/<model>/<SC|TC|QA|IR>/...)")
    records = []
    for path in sorted(root.glob("*/*/*/*/results.json")):
        run_dir, task_dir, family_dir, model_dir = path.parent, path.parent.parent, path.parents[2], path.parents[3]
        match = _RUN_DIR.match(run_dir.name)
        if family_dir.name not in FAMILIES or match is None:
            raise EncodEvalFormatError(f"{path}: expected <model>/<SC|TC|QA|IR>/<task>/[<train>_]lr<lr>_sd<seed>/")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise EncodEvalFormatError(f"{path}: not readable JSON ({err})") from err
        if not isinstance(raw, dict):
            raise EncodEvalFormatError(f"{path}: expected a JSON object")
        validation, test = _score(path, raw, "validation"), _score(path, raw, "test")
        extra = {"source": str(path)}
        if match["train"]:
            extra["trained_on"] = match["train"]
        records.append(RunRecord(
            model=model_dir.name, task=TASK_NAMES.get(task_dir.name, task_dir.name), family=FAMILIES[family_dir.name],
            main_metric="score", learning_rate=float(match["lr"]), seed=int(match["seed"]),
            validation={"score": validation}, test={"score": test}, diverged=not math.isfinite(test), steps=0,
            train_loss_first=float("nan"), train_loss_last=float("nan"), fingerprint="encodeval-release",
            extra=extra))
    if not records:
        raise EncodEvalFormatError(f"{root}: no <model>/<SC|TC|QA|IR>/<task>/<run>/results.json files")
    return records
