"""Following submitted Slurm jobs without an accounting database: `scontrol show job` (every cluster has it; Slurm
keeps a finished job there for MinJobAge, 300 s by default), `sacct` only when a job has left it.

NeMo-Run waits for a Slurm job through `sacct`, which needs slurmdbd; a launch here submits detached and waits
with `wait_for_jobs` instead, printing each job's state changes (started, requeued, finished) as they happen.
"""
from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

# States a job does not leave by itself (a requeue turns PREEMPTED back into PENDING, so it is not one).
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "DEADLINE", "BOOT_FAIL"}
NEVER_RUNS = {"DependencyNeverSatisfied"}  # pending for ever: a job it depends on did not succeed


@dataclass
class JobState:
    job_id: str
    state: str  # Slurm's JobState, or UNKNOWN when Slurm no longer knows the job
    reason: str = ""
    restarts: int = 0
    exit_code: str = ""
    nodes: str = ""
    array_task: str = ""  # an array task's index (or a range of still-pending ones); "" for a plain job
    tasks: tuple[JobState, ...] = ()  # an array job's tasks, each with its own job id; () for a plain job

    @property
    def final(self) -> bool:
        if self.tasks:
            return all(task.final for task in self.tasks)
        return self.state in FINAL or self.state == "UNKNOWN" or (self.state == "PENDING"
                                                                  and self.reason in NEVER_RUNS)

    def describe(self) -> str:
        if self.tasks:  # each task's own line: one requeued task is told apart from the others
            return f"{self.state}: " + "; ".join(f"task {t.array_task} {t.describe()}" for t in self.tasks)
        text = self.state
        if self.state == "PENDING" and self.reason not in ("", "None"):
            text += f" ({self.reason})"
        if self.nodes and self.state == "RUNNING":
            text += f" on {self.nodes}"
        if self.restarts:
            text += f", restarted {self.restarts}×"
        if self.state in FINAL and self.exit_code:
            text += f", exit {self.exit_code}"
        return text


def _fields(line: str) -> dict[str, str]:
    return dict(token.split("=", 1) for token in line.split() if "=" in token)


def _state_of(f: dict[str, str]) -> JobState:
    return JobState(f.get("JobId", ""), f.get("JobState", "UNKNOWN"), f.get("Reason", ""),
                    int(f.get("Restarts", "0") or 0), f.get("ExitCode", ""),
                    "" if f.get("NodeList") == "(null)" else f.get("NodeList", ""), f.get("ArrayTaskId", ""))


def _array_state(job_id: str, tasks: list[JobState]) -> JobState:
    """An array job as one state: PENDING/RUNNING while any task is, else COMPLETED when every task completed,
    else the first task's state that is not; its restarts are the tasks' together."""
    tasks = sorted(tasks, key=lambda t: int(t.array_task.split("-")[0].split(",")[0] or 0))
    states = [t.state for t in tasks]
    if not all(t.final for t in tasks):
        state = "RUNNING" if "RUNNING" in states else next(s for s, t in zip(states, tasks) if not t.final)
    else:
        state = next((s for s in states if s != "COMPLETED"), "COMPLETED")
    return JobState(job_id, state, restarts=sum(t.restarts for t in tasks), tasks=tuple(tasks))


def job_state(job_id: str) -> JobState:
    """A job's state; for a job array (`job_id` its ArrayJobId) its tasks' together, each in `tasks`."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip():
        lines = [_fields(line) for line in out.stdout.splitlines() if line.strip()]
        if lines[0].get("ArrayTaskId") and lines[0].get("ArrayJobId") == job_id:
            return _array_state(job_id, [_state_of(f) for f in lines])
        state = _state_of(lines[0])
        state.job_id = job_id
        return state
    acct = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State,ExitCode"], capture_output=True,
                          text=True)
    if acct.returncode == 0 and acct.stdout.strip():
        state, _, code = acct.stdout.splitlines()[-1].partition("|")
        return JobState(job_id, state.split()[0], exit_code=code)
    return JobState(job_id, "UNKNOWN")


def job_id_of(handle: str) -> str:
    """NeMo-Run's handle of a Slurm job (`slurm_tunnel://nemo_run/12345`) → `12345`."""
    match = re.search(r"(\d+)$", handle or "")
    if not match:
        raise ValueError(f"not a Slurm job handle: {handle!r}")
    return match.group(1)


def wait_for_jobs(jobs: dict[str, str], poll_s: float = 2.0, timeout_s: float | None = None,
                  log=print) -> dict[str, JobState]:
    """Wait until every job (task name → job id) is final; `log` gets one line per change of state."""
    seen: dict[str, str] = {}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        states = {name: job_state(job_id) for name, job_id in jobs.items()}
        for name, state in states.items():
            line = state.describe()
            if seen.get(name) != line:
                log(f"[slurm] job {state.job_id} ({name}): {line}")
                seen[name] = line
        if all(s.final for s in states.values()):
            return states
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"Slurm jobs not finished after {timeout_s:.0f} s: "
                               + ", ".join(f"{n} {s.describe()}" for n, s in states.items()))
        time.sleep(poll_s)


def job_logs(folder: Path, job_id: str, array: tuple[str, str] | None = None) -> list[Path]:
    """The task's own logs of a job (one per start: `log-<name>_<id>_<restart>.out`), then the batch script's.
    An array task: `job_id` is its own job id, `array` its (ArrayJobId, index), which name its batch log."""
    folder = Path(folder)
    starts = sorted(folder.rglob(f"log-*_{job_id}_*.out"), key=lambda p: int(p.stem.rsplit("_", 1)[-1]))
    batch = f"sbatch_*_{array[0]}_{array[1]}.out" if array else f"sbatch_*_{job_id}.out"
    return starts + sorted(folder.rglob(batch))


_PREFIX = re.compile(r"^\[default\d+\]:(\[rank\d+\]:)?", re.M)  # torchrun's per-rank line prefixes
_ERROR = re.compile(r"Traceback|Error|error:|not requeued")


def error_lines(folder: Path, job_id: str, lines: int = 12) -> list[str]:
    """Where the user looks: the last start's task log around its error (its path first), and the batch script's
    verdict on requeueing; for a job array, those of each task that did not complete."""
    state = job_state(job_id)
    if state.tasks:
        return [line for task in state.tasks if task.state != "COMPLETED"
                for line in [f"task {task.array_task} (job {task.job_id}): {task.describe()}"]
                + _error_lines(job_logs(folder, task.job_id, (job_id, task.array_task)), task.job_id, lines)]
    return _error_lines(job_logs(folder, job_id), job_id, lines)


def _error_lines(logs: list[Path], job_id: str, lines: int) -> list[str]:
    out = []
    task_logs = [p for p in logs if p.name.startswith("log-")]
    if task_logs:
        text = _PREFIX.sub("", task_logs[-1].read_text(errors="replace")).rstrip().splitlines()
        hits = [i for i, line in enumerate(text) if _ERROR.search(line)]
        end = min(len(text), hits[-1] + 3) if hits else len(text)
        out += [f"({task_logs[-1]})"] + text[max(0, end - lines):end]
    for batch in (p for p in logs if p.name.startswith("sbatch_")):
        verdicts = [line for line in batch.read_text(errors="replace").splitlines()
                    if line.startswith("mlmclm: ")]
        if verdicts:
            out += [f"({batch})"] + verdicts[-3:]
    return out or [f"(no log of job {job_id} found)"]
