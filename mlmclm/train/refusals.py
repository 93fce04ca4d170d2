"""The trainer's refusals: errors it raises on purpose for input it will not train on.

An incompatible resume or branch, a bad config, bad or unreadable data, a checkpoint that is incomplete or would run
code, a run directory another run holds or that is not ours. A refusal is reported as its own message — one line,
no traceback — with exit code 2, and rank 0 records it in run_status.json as `refused` (recipes.launch reads it
there and prints it once). Any other exception is a failure: its traceback is the report.
"""
from __future__ import annotations

from mlmclm.train.checkpoint import CheckpointError
from mlmclm.train.checkpoint_guard import UnsafeCheckpointError
from mlmclm.train.run_lock import RunLockedError

# ValueError: config and data validation, IncompatibleCheckpointError/BranchError, refused files (FileRefusedError).
REFUSALS = (ValueError, CheckpointError, UnsafeCheckpointError, RunLockedError)
REFUSED_EXIT_CODE = 2
# What a rank prints, on its own line, before exiting with REFUSED_EXIT_CODE: the launcher finds a refusal that
# run_status.json cannot hold (a run directory another run holds is that run's to write) by this mark.
REFUSAL_MARK = "mlmclm refused: "


def is_refusal(err: BaseException) -> bool:
    return isinstance(err, REFUSALS)
