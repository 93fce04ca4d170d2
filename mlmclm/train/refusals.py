"""The trainer's refusals: errors it raises on purpose for input it will not train on.

An incompatible resume or branch, a bad config, bad or unreadable data, a checkpoint that is incomplete or would run
code, a run directory another run holds or that is not ours. A refusal is reported as its own message — one line,
no traceback — with exit code 2, and rank 0 records it in run_status.json as `refused` (recipes.launch reads it
there and prints it once). Any other exception is a failure: its traceback is the report — and so is one of these
types raised outside mlmclm (a ValueError from torch or megatron is a bug or a limit to see whole, not a message we
wrote for the user).
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

from mlmclm.parallel.torchrun import REFUSED_EXIT_CODE  # noqa: F401  (the exit code the agent passes on to Slurm)
from mlmclm.redact import redact
from mlmclm.train.checkpoint_files import CheckpointError
from mlmclm.train.checkpoint_guard import UnsafeCheckpointError
from mlmclm.train.run_lock import RunLockedError

# ValueError: config and data validation, IncompatibleCheckpointError/BranchError, refused files (FileRefusedError).
REFUSALS = (ValueError, CheckpointError, UnsafeCheckpointError, RunLockedError)
# What a rank prints, on its own line, before exiting with REFUSED_EXIT_CODE: the launcher finds a refusal that
# run_status.json cannot hold (a run directory another run holds is that run's to write) by this mark.
REFUSAL_MARK = "mlmclm refused: "
FAILED_EXIT_CODE = 1


# The package whose own raise statements word refusals: the innermost frame of a refusal's traceback lies here.
_OURS = Path(__file__).resolve().parents[1]


def is_refusal(err: BaseException) -> bool:
    """One of REFUSALS that mlmclm raised itself (re-raised with `from` counts: its frame is ours)."""
    return isinstance(err, REFUSALS) and raised_by_us(err)


def raised_by_us(err: BaseException) -> bool:
    frame = err.__traceback__
    if frame is None:  # built, not raised yet: its maker decides
        return True
    while frame.tb_next is not None:
        frame = frame.tb_next
    return Path(frame.tb_frame.f_code.co_filename).resolve().is_relative_to(_OURS)


def report_failure(err: BaseException, stream=None) -> int:
    """Print a failure's traceback — the report of a bug — with any data location's credentials masked
    (mlmclm.redact), as Python's own hook would print it but for that; returns the exit code a failed rank ends with."""
    print(redact("".join(traceback.format_exception(err))), file=stream or sys.stderr, flush=True)
    return FAILED_EXIT_CODE
