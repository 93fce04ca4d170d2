"""Launching through `python -m recipes` on the local Slurm, and reading what Slurm says about the jobs."""
import re
import subprocess
import sys
import time
from pathlib import Path

from cluster.local_slurm import LocalSlurm
from cluster.slurm_jobs import job_state

REPO = Path(__file__).resolve().parents[2]

# CPU ranks (no GPUs asked), jobs sharing the two nodes (the suite has 2 cores for everything).
SLURM_ARGS = ["--executor", "slurm", "executor.gpus=false", "executor.exclusive=false"]


def recipes_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "recipes", *args]


def submitted_line(console: str) -> str | None:
    """The launch's `submitted: NAME = Slurm job ID, ..., logs under DIR` line, once it has printed it."""
    return next((line for line in console.splitlines() if line.startswith("submitted: ")), None)


def submitted_jobs(console: str) -> dict[str, str]:
    """task name → Slurm job id, from the launch's submitted line."""
    return dict(re.findall(r"([\w.-]+) = Slurm job (\d+)", submitted_line(console)))


def job_fields(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True)
    return dict(token.split("=", 1) for token in out.stdout.split() if "=" in token)


def wait_until(predicate, timeout: float, what: str, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"not after {timeout:.0f} s: {what}")


def wait_final(job_id: str, timeout: float = 600):
    return wait_until(lambda: (s := job_state(job_id)).final and s, timeout, f"job {job_id} finished")


def no_job_process_left(cluster: LocalSlurm, timeout: float = 20) -> None:
    """Every process of the cluster's jobs (slurmstepd, agents, ranks, anything they started) is gone."""
    deadline = time.monotonic() + timeout
    while cluster.job_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    left = cluster.job_processes()
    assert not left, f"job processes still running after their job ended: {left}"
