"""What became of a launched task that did not succeed — preempted, interrupted, refused or failed — told from its
run's run_status.json and its own logs, since NeMo-Run (and Slurm) report every non-zero exit as FAILED."""
from __future__ import annotations

import json
import re
from pathlib import Path

from mlmclm.train.run_status import STATUS_FILE
from recipes.progress import checkpointed_step


class TaskFailedError(RuntimeError):
    pass


class TaskPreemptedError(TaskFailedError):
    """Every failed task stopped for a preemption after saving (the ranks exit 75; NeMo-Run only sees "failed")."""


class TaskInterruptedError(TaskFailedError):
    """Ctrl-C stopped a local launch (recipes.interrupt); the message says what each task saved."""


class TaskRefusedError(TaskFailedError):
    """The trainer refused a task's input (mlmclm.train.refusals); the message is the trainer's own, once."""


def status_stamp(run_dir: str) -> tuple[int, int] | None:
    """When and how long RUN/run_status.json was last written (None if absent): a status written by this launch
    is told from one an earlier attempt left."""
    try:
        info = (Path(run_dir) / STATUS_FILE).stat()
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


def refusals(failed: list[str], run_dirs: dict[str, str], stamps_before: dict, exp_dir: str | Path | None) -> str:
    """One line per failed task the trainer refused: its run_status.json's `refused` message written by this
    launch, else the refusal a rank printed (a run directory another run holds: its status is that run's).
    Empty when none was refused. `exp_dir`: where the local tasks' rank logs are (None: not searched)."""
    lines = []
    for name in failed:
        state = run_status(run_dirs[name])
        fresh = status_stamp(run_dirs[name]) != stamps_before.get(name)
        message = state.get("detail") if fresh and state.get("status") == "refused" else None
        if message is None and exp_dir is not None:
            message = logged_refusal(exp_dir, name)
        if message:
            lines.append(f"task {name} refused: {message}")
    return "\n".join(lines)


def logged_refusal(exp_dir: str | Path, task: str) -> str | None:
    """The refusal a rank of the task's latest attempt printed (recipes.entry), if any."""
    from mlmclm.train.refusals import REFUSAL_MARK

    attempts = sorted((Path(exp_dir) / task).rglob("attempt_*"), key=lambda p: p.stat().st_mtime)
    for path in sorted(attempts[-1].glob("*/stderr.log")) if attempts else []:
        for line in _RANK_PREFIX.sub("", path.read_text(errors="replace")).splitlines():
            if line.startswith(REFUSAL_MARK):
                return line.removeprefix(REFUSAL_MARK)
    return None


def preemption_report(failed: list[str], run_dirs: dict[str, str]) -> str | None:
    """When every failed task stopped for a preemption after saving, say so (else None: a real failure)."""
    states = {name: run_status(run_dirs[name]) for name in failed}
    if not failed or any(state.get("status") != "preempted" for state in states.values()):
        return None
    return "\n".join(f"task {name}: PREEMPTED at step {state.get('step')}, checkpoint saved in {run_dirs[name]}; run "
                     f"the same command again to resume" for name, state in states.items())


def run_status(run_dir: str) -> dict:
    """What the run's rank 0 last wrote to RUN/run_status.json ({} if nothing, or not a local path)."""
    path = Path(run_dir) / STATUS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def interrupted_report(failed: list[str], run_dirs: dict[str, str]) -> str:
    """After Ctrl-C: for each task that did not finish, the step it saved (or that it saved nothing new)."""
    lines = []
    for name in failed:
        state, saved = run_status(run_dirs[name]), checkpointed_step(Path(run_dirs[name]))
        if state.get("status") == "preempted":
            lines.append(f"stopping: saved step {state.get('step')} in {run_dirs[name]} — run the same command to "
                         f"resume")
        elif saved is None:
            lines.append(f"stopped: {name} had saved no checkpoint yet (nothing to resume; the same command starts "
                         f"it afresh)")
        else:
            lines.append(f"stopped: {name} stopped before saving again; its last checkpoint is step {saved} in "
                         f"{run_dirs[name]} — run the same command to resume")
    return "\n".join(lines)


_ROOT_CAUSE_RANK = re.compile(r"Root Cause.*?\brank\s*:\s*(\d+)", re.S)
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:", re.M)


def task_error(exp_dir: str | Path, task: str, lines: int = 12) -> list[str]:
    """The last lines of a failed task's own error: the root-cause rank's stderr from torchrun's latest attempt
    (else any rank's that shows an error), else the task's combined log."""
    task_dir = Path(exp_dir) / task
    combined = sorted(task_dir.rglob("combined.log"), key=lambda p: p.stat().st_mtime)
    combined_text = combined[-1].read_text(errors="replace") if combined else ""
    attempts = sorted(task_dir.rglob("attempt_*"), key=lambda p: p.stat().st_mtime)
    candidates = []
    if attempts:
        ranks = sorted(attempts[-1].glob("*/stderr.log"), key=lambda p: p.parent.name)
        cause = _ROOT_CAUSE_RANK.search(combined_text)
        candidates = [p for p in ranks if cause and p.parent.name == cause.group(1)] + ranks
    for path in candidates:
        text = _RANK_PREFIX.sub("", path.read_text(errors="replace")).rstrip()
        if "Error" in text or "Traceback" in text:
            return [f"({path})"] + text.splitlines()[-lines:]
    if combined_text:
        return [f"({combined[-1]})"] + combined_text.rstrip().splitlines()[-lines:]
    return [f"(no task log found under {task_dir})"]
