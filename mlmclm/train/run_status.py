"""run_status.json: rank 0's last word on a run, which the launcher reads (recipes.launch) since NeMo-Run and
Slurm see every non-zero exit alike."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from mlmclm.atomic_write import write_atomic
from mlmclm.redact import redact
from mlmclm.train.config import TrainConfig
from mlmclm.train.refusals import is_refusal
from mlmclm.train.save_errors import CheckpointWriteError

log = logging.getLogger("mlmclm.train")

# rank 0's last word on the run: completed, preempted, segment_done, save_failed, refused or failed, with the step
STATUS_FILE = "run_status.json"


def write_status(cfg: TrainConfig, status: str, step: int | None, detail: str = "") -> None:
    path = Path(cfg.run_dir) / STATUS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"status": status, "step": step, "detail": redact(detail)}))


def write_failure_status(cfg: TrainConfig, err: Exception, step: int | None) -> None:
    """`save_failed` or `refused` (with the error's own message: mlmclm.train.refusals), else `failed`; a status
    that cannot be written either (a disk still full) is logged, never raised over the run's own error."""
    status = ("save_failed" if isinstance(err, CheckpointWriteError) else "refused" if is_refusal(err)
              else "failed")
    try:
        write_status(cfg, status, step, f"{type(err).__name__}: {err}" if status == "failed" else str(err))
    except OSError as status_err:
        log.error("could not write %s either: %s", STATUS_FILE, status_err)
