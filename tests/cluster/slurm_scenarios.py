"""Every launch of the Slurm tests, started together (the suite's budget: most of a Slurm scenario is waiting — for
a time-limit check, a requeue, a dependency — so the scenarios overlap their waits) and followed to their end before
any test looks at them; each test then asserts on its own scenario.

- training: one tiny CLM→MLM config twice — uninterrupted on the local executor (the reference), and on two Slurm
  nodes, preempted twice as Slurm delivers it (its time limit with the recipe's `--signal=USR1@N` lead, then
  `scancel --signal=USR1`) and requeued, launched as a user would and followed on its console to the end;
- failure: a run whose every rank refuses its data at start: not requeued, whatever `max_requeues` allows;
- sweep: the tiny grid at one rank a job, whose continued-pretraining and branch jobs wait for their parents through
  afterok.
- eval: the smoke grid of a tiny model, locally and as a Slurm job array of 2 tasks with one requeued mid-way, and
  a refusal (eval_scenarios.py).

The suite has 2 cores for all of it, so every launch that a test does not need costs every other one time: the
two-node run is the preempted one (each of its three starts a rendezvous across the nodes), not a fourth job.
"""
import json
import math
import subprocess
import time
from pathlib import Path

from cluster.slurm_jobs import job_state
from eval_scenarios import eval_launches, in_background, joined, requeue_mid_way
from slurm_helpers import (REPO, SLURM_ARGS, job_fields, recipes_command, submitted_jobs, submitted_line,
                           wait_final, wait_until)

# Long enough that the preempted run is still training when its time-limit warning comes (Slurm checks time limits
# every 30 s: up to 30 s after the test shortens the limit).
STEPS = 100
# The preempted run's --signal lead: over a minute, so that the shortened limit (whole minutes, ending within the
# next minute) puts the warning at Slurm's next check (the save itself takes about a second here).
NOTICE_S = 90
TIMEOUT_S = 900


def _seconds(runtime: str) -> int:
    days, _, clock = runtime.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return (int(days or 0) * 24 + h) * 3600 + m * 60 + s


def last_step(run_dir: Path) -> int:
    try:
        rows = (run_dir / "metrics.jsonl").read_text().splitlines()
        return max((json.loads(r).get("step", 0) for r in rows if r.strip()), default=0)
    except (OSError, ValueError):
        return 0


def run_status(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "run_status.json").read_text())
    except (OSError, ValueError):
        return {}


def losses(run_dir: Path) -> list[dict]:
    """Every logged number of every step except the timings (losses, accuracies, LR, grad norm, validation)."""
    rows = [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines() if r.strip()]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


def _start(env: dict, console: Path, *args: str) -> subprocess.Popen:
    """A launch in the background, its stdout and stderr going to files (a pipe nobody reads could fill and block
    it while the scenarios run)."""
    with open(console.with_suffix(".out"), "w") as out, open(console.with_suffix(".err"), "w") as err:
        return subprocess.Popen(recipes_command(*args), env=env, cwd=REPO, stdout=out, stderr=err, text=True,
                                stdin=subprocess.DEVNULL)


def _preempt(job_id: str, run_dir: Path, facts: dict) -> None:
    """Start 0: once it trains, shorten its time limit so that Slurm's USR1 lead falls due within a minute;
    start 1 (the requeued job, limit restored): `scancel --signal=USR1` once it trains again; start 2 finishes."""
    wait_until(lambda: last_step(run_dir) >= 1, 400, "the first start trains")
    runtime = _seconds(job_fields(job_id)["RunTime"])
    # the job now ends 40-100 s from now, and its 90 s lead falls due within 10 s: the warning comes at Slurm's next
    # time-limit check (<= 30 s later), at least 60 s before the end
    limit_min = math.ceil((runtime + 40) / 60)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={limit_min}"], check=True)
    facts["time_limit_ends_in_s"] = limit_min * 60 - runtime
    updated = time.monotonic()
    wait_until(lambda: job_state(job_id).restarts >= 1 or job_state(job_id).final, 240,
               "the time-limit warning preempts the first start")
    assert run_status(run_dir).get("status") == "preempted", (
        f"the first start was not preempted: {run_status(run_dir)} (a machine this fast needs more STEPS)")
    facts["warning_after_s"] = round(time.monotonic() - updated)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=00:10:00"], check=True)
    facts["first"] = run_status(run_dir)
    wait_until(lambda: job_state(job_id).state == "RUNNING" and last_step(run_dir) >= facts["first"]["step"] + 2,
               400, "the requeued job resumes and trains")
    sent = time.monotonic()
    subprocess.run(["scancel", "--signal=USR1", job_id], check=True)
    wait_until(lambda: job_state(job_id).restarts >= 2 or job_state(job_id).final, 240, "scancel's USR1 preempts")
    facts["scancel_to_requeue_s"] = round(time.monotonic() - sent)
    facts["second"] = run_status(run_dir)


def launch_all(env: dict, shared: Path, data: str) -> dict:
    """Start every scenario, drive the preemptions, wait for all of them; what each test asserts on."""
    dirs = {name: shared / f"train-{name}" for name in ("local", "preempted")}
    out = {"dirs": dirs, "facts": {}, "grid_root": shared / "grid", "broken_data": shared / "broken_data",
           "failing_run": shared / "failing_run"}
    out["broken_data"].mkdir()
    (out["broken_data"] / "manifest.json").write_text("{not json")  # read by every rank at start: each raises
    common = ["tiny_clm_mlm", f"steps={STEPS}", f"data_path={data}"]
    slurm = [*common, "nodes=2", "processes=1", *SLURM_ARGS, "executor.cpus_per_task=1"]
    consoles = shared / "consoles"
    consoles.mkdir()
    launches = {
        "local": [*common, "processes=2", f"run_dir={dirs['local']}", "executor.gpus=false"],
        "preempted": [*slurm, f"run_dir={dirs['preempted']}", "executor.time=00:10:00",
                      f"executor.preemption_notice_s={NOTICE_S}"],
        "failure": ["tiny_clm_mlm", "steps=4", "processes=1", f"data_path={out['broken_data']}",
                    f"run_dir={out['failing_run']}", *SLURM_ARGS, "executor.cpus_per_task=1",
                    "executor.max_requeues=1"],
        "sweep": ["grid", "tiny", "--run-root", str(out["grid_root"]), "--data-path", data, "processes=1",
                  *SLURM_ARGS, "executor.cpus_per_task=1"],
    }
    launches.update(eval_launches(shared, out))
    env = {**env, "PYTHONUNBUFFERED": "1"}  # the preempted launch's console is read while it runs
    started = {name: _start(env, consoles / name, *args) for name, args in launches.items()}
    try:
        requeue = in_background(requeue_mid_way, consoles / "eval_array.out", out["eval_dirs"]["array"],
                                out.setdefault("eval_facts", {}))
        console = consoles / "preempted.out"
        submitted = wait_until(lambda: submitted_line(console.read_text()), 300, "the preempted run is submitted")
        (job_id,) = submitted_jobs(submitted).values()
        out["job_id"] = job_id
        out["exp_dir"] = submitted.split("logs under ", 1)[1]
        _preempt(job_id, dirs["preempted"], out["facts"])
        out["final"] = wait_final(job_id)
        joined(requeue, TIMEOUT_S)
        for name, proc in started.items():
            proc.wait(timeout=TIMEOUT_S)
            stdout, stderr = ((consoles / f"{name}{suffix}").read_text() for suffix in (".out", ".err"))
            out[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    finally:
        for proc in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out
