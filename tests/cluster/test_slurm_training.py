"""Training on the real scheduler through `python -m recipes ... --executor slurm`, three runs of one config at once
(the suite's budget): the local executor's, an uninterrupted one on two Slurm nodes, and one preempted twice as
Slurm delivers it — by its time limit with the recipe's `--signal=USR1@N` lead, then by `scancel --signal=USR1`
(every process of the step gets USR1: the torchrun agents, the ranks, the checkpoint helpers) — and requeued.
"""
import json
import math
import subprocess
import time

import pytest

from cluster.slurm_jobs import job_state
from slurm_helpers import (REPO, SLURM_ARGS, job_fields, no_job_process_left, recipes_command, run_recipes,
                           submitted_jobs, wait_until)

# Long enough that the preempted run is still training when its time-limit warning comes (Slurm checks time limits
# every 30 s: up to 30 s after the test shortens the limit).
STEPS = 100
# The preempted run's --signal lead: over a minute, so that the shortened limit (whole minutes, ending within the
# next minute) puts the warning at Slurm's next check (the save itself takes about a second here).
NOTICE_S = 90


def _seconds(runtime: str) -> int:
    days, _, clock = runtime.rpartition("-")
    h, m, s = (int(x) for x in clock.split(":"))
    return (int(days or 0) * 24 + h) * 3600 + m * 60 + s


def _last_step(run_dir) -> int:
    try:
        rows = (run_dir / "metrics.jsonl").read_text().splitlines()
        return max((json.loads(r).get("step", 0) for r in rows if r.strip()), default=0)
    except (OSError, ValueError):
        return 0


def _status(run_dir) -> dict:
    try:
        return json.loads((run_dir / "run_status.json").read_text())
    except (OSError, ValueError):
        return {}


def _losses(run_dir) -> list[dict]:
    """Every logged number of every step except the timings (losses, accuracies, LR, grad norm, validation)."""
    rows = [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines() if r.strip()]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


@pytest.fixture(scope="module")
def runs(slurm_cluster, launch_env, shared, slurm_data):
    common = ["tiny_clm_mlm", f"steps={STEPS}", f"data_path={slurm_data}"]
    slurm = [*common, "nodes=2", "processes=1", *SLURM_ARGS, "executor.cpus_per_task=1"]
    out = {"dirs": {name: shared / f"train-{name}" for name in ("local", "two_nodes", "preempted")}, "facts": {}}
    local = subprocess.Popen(recipes_command(*common, "processes=2", f"run_dir={out['dirs']['local']}",
                                             "executor.gpus=false"),
                             env=launch_env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             stdin=subprocess.DEVNULL)
    # two two-node jobs share the host: their torchrun rendezvous need distinct ports
    reference = subprocess.Popen(recipes_command(*slurm, f"run_dir={out['dirs']['two_nodes']}",
                                                 "executor.rdzv_port=29611"),
                                 env=launch_env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 stdin=subprocess.DEVNULL)
    try:
        submitted = run_recipes(launch_env, *slurm, f"run_dir={out['dirs']['preempted']}", "executor.rdzv_port=29622",
                                "executor.time=00:10:00", f"executor.preemption_notice_s={NOTICE_S}", "--detach")
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        (job_id,) = submitted_jobs(submitted.stdout).values()
        out["job_id"] = job_id
        out["exp_dir"] = next(line.split("logs under ", 1)[1] for line in submitted.stdout.splitlines()
                              if line.startswith("submitted: "))
        _preempt(job_id, out["dirs"]["preempted"], out["facts"])
        out["final"] = wait_until(lambda: (s := job_state(job_id)).final and s, 600, f"job {job_id} finished")
        out["local"] = local.communicate(timeout=600)[0], local.returncode
        out["two_nodes"] = reference.communicate(timeout=600)[0], reference.returncode
    finally:
        for proc in (local, reference):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


def _preempt(job_id: str, run_dir, facts: dict) -> None:
    """Start 0: once it trains, shorten its time limit so that Slurm's USR1 lead falls due within a minute;
    start 1 (the requeued job, limit restored): `scancel --signal=USR1` once it trains again; start 2 finishes."""
    wait_until(lambda: _last_step(run_dir) >= 1, 400, "the first start trains")
    runtime = _seconds(job_fields(job_id)["RunTime"])
    # the job now ends 40-100 s from now, and its 90 s lead falls due within 10 s: the warning comes at Slurm's next
    # time-limit check (<= 30 s later), at least 60 s before the end
    limit_min = math.ceil((runtime + 40) / 60)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={limit_min}"], check=True)
    facts["time_limit_ends_in_s"] = limit_min * 60 - runtime
    updated = time.monotonic()
    wait_until(lambda: job_state(job_id).restarts >= 1 or job_state(job_id).final, 240,
               "the time-limit warning preempts the first start")
    assert _status(run_dir).get("status") == "preempted", (
        f"the first start was not preempted: {_status(run_dir)} (a machine this fast needs more STEPS)")
    facts["warning_after_s"] = round(time.monotonic() - updated)
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=00:10:00"], check=True)
    facts["first"] = _status(run_dir)
    wait_until(lambda: job_state(job_id).state == "RUNNING" and _last_step(run_dir) >= facts["first"]["step"] + 2,
               400, "the requeued job resumes and trains")
    sent = time.monotonic()
    subprocess.run(["scancel", "--signal=USR1", job_id], check=True)
    wait_until(lambda: job_state(job_id).restarts >= 2 or job_state(job_id).final, 240, "scancel's USR1 preempts")
    facts["scancel_to_requeue_s"] = round(time.monotonic() - sent)
    facts["second"] = _status(run_dir)


def test_two_slurm_nodes_train_like_the_local_executor(runs):
    """torchrun's rendezvous across two Slurm nodes; the same losses, bit for bit, as the local executor's run."""
    console, rc = runs["two_nodes"]
    assert rc == 0, console
    assert "RUNNING on n[1-2]" in console  # one task per node
    assert runs["local"][1] == 0, runs["local"][0]
    two_nodes, local = _losses(runs["dirs"]["two_nodes"]), _losses(runs["dirs"]["local"])
    assert [row["step"] for row in two_nodes] == list(range(1, STEPS + 1))
    assert two_nodes == local


def test_preempted_by_time_limit_and_scancel_usr1_saves_requeues_and_resumes_exactly(runs, slurm_cluster):
    job_id, run_dir, facts = runs["job_id"], runs["dirs"]["preempted"], runs["facts"]
    print(f"measured: {facts}")
    final = runs["final"]
    assert (final.state, final.restarts) == ("COMPLETED", 2), final.describe()
    # each preemption published a checkpoint at the step it stopped, and the next start resumed from it
    first, second = facts["first"], facts["second"]
    assert first["status"] == "preempted" and second["status"] == "preempted", facts
    assert first["step"] < second["step"] < STEPS
    assert first["detail"].endswith(f"iter_{first['step']:07d}") and second["detail"].endswith(
        f"iter_{second['step']:07d}")
    # every process of the step saved or ignored USR1: the ranks all exited 75 after the save (a rank, agent or
    # checkpoint helper killed by it would turn the exit into a failure), and the job requeued itself as preempted
    logs = {p.name: p.read_text(errors="replace") for p in sorted((REPO / runs["exp_dir"]).rglob(f"*_{job_id}*.out"))}
    starts = [logs[name] for name in sorted(n for n in logs if n.startswith("log-"))]
    assert len(starts) == 3
    for text in starts[:2]:
        assert "stop requested (SIGTERM/SIGUSR1): saved at step" in text
        assert "torchrun: ranks stopped after a preemption save (exit codes [75]); exiting 75" in text
    for text in starts:
        assert "SIGUSR1" not in text.replace("SIGTERM/SIGUSR1", "") and "exitcode: -10" not in text, text[-3000:]
    (batch,) = [text for name, text in logs.items() if name.startswith("sbatch_")]
    verdicts = [line for line in batch.splitlines() if line.startswith("mlmclm: ")]
    assert verdicts == ["mlmclm: preempted after saving (exit 75): requeued, the run resumes from its checkpoint"] * 2
    assert _status(run_dir) == {"status": "completed", "step": STEPS,
                                "detail": str(run_dir / "checkpoints" / f"iter_{STEPS:07d}")}
    # bit-identical to the uninterrupted run (one row per step: metrics.jsonl is rewound at each resume)
    assert _losses(run_dir) == _losses(runs["dirs"]["two_nodes"])
    no_job_process_left(slurm_cluster)
