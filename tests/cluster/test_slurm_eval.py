"""The evaluation on the real scheduler (`python -m recipes eval ... --executor slurm`, eval_scenarios.py): a job array
of 2 tasks over one output folder, one task requeued by `scontrol requeue` while the grid is half done, ends with
the summary of the same grid run on the local executor; a model folder that is not a model is a refusal — FAILED,
not requeued whatever `max_requeues` allows, its one line on the launch's console."""
import json

import pytest

from cluster.slurm_jobs import job_logs
from eval_scenarios import UNITS, records
from slurm_helpers import job_fields, no_job_process_left, submitted_jobs, submitted_line

# The first test to ask for `scenarios` runs every Slurm launch in its setup (slurm_scenarios.py): 5 min measured
# on this otherwise idle 2-core machine; under load it takes longer, and the suite-wide 600 s per test could cut it off.
pytestmark = pytest.mark.timeout(1800)


def _scores(output) -> dict:
    """Every record's scores by its path in the output (not the timings, nor the training losses: those differ in
    their last bits between the local run's two threads and a Slurm task's one, measured here)."""
    return {str(path.relative_to(output)): {k: v for k, v in json.loads(path.read_text()).items()
                                            if k in ("validation", "test", "steps", "diverged")}
            for path in records(output)}


def test_an_eval_array_with_a_requeued_task_gives_the_local_runs_summary(scenarios, slurm_cluster):
    local, array = scenarios["eval_local"], scenarios["eval_array"]
    assert local.returncode == 0, local.stdout + local.stderr
    assert array.returncode == 0, array.stdout[-3000:] + array.stderr[-3000:]
    facts, dirs = scenarios["eval_facts"], scenarios["eval_dirs"]
    print(f"measured: {facts}")
    assert 0 < facts["records_at_requeue"] < UNITS, facts
    job, task = facts["array"], facts["requeued_task"]
    # Slurm's own account of the array: both tasks completed, the requeued one after a second start
    tasks = {f["ArrayTaskId"]: f for f in (dict(t.split("=", 1) for t in line.split() if "=" in t)
                                            for line in _show(job))}
    assert {i: (f["JobState"], f["Restarts"]) for i, f in tasks.items()} == {
        task: ("COMPLETED", "1"), str(1 - int(task)): ("COMPLETED", "0")}, tasks
    assert f"task {task} COMPLETED, restarted 1×" in array.stdout, array.stdout
    starts = [p for p in job_logs(submitted_line(array.stdout).split("logs under ", 1)[1], facts["requeued_job"],
                                  (job, task)) if p.name.startswith("log-")]
    assert len(starts) == 2, starts
    # the same grid, the same numbers: the summary bit for bit, and every record's scores
    assert (dirs["array"] / "summary.json").read_bytes() == (dirs["local"] / "summary.json").read_bytes()
    assert _scores(dirs["array"]) == _scores(dirs["local"]) and len(records(dirs["local"])) == UNITS
    no_job_process_left(slurm_cluster)


def _show(job_id: str) -> list[str]:
    import subprocess

    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=True)
    return [line for line in out.stdout.splitlines() if line.strip()]


def test_a_model_folder_that_is_not_a_model_fails_the_array_and_is_not_requeued(scenarios, slurm_cluster):
    result, broken = scenarios["eval_refused"], scenarios["not_a_model"]
    assert result.returncode == 2, result.stdout + result.stderr
    err = result.stderr
    line = "is not a Hugging Face model folder (no config.json)"
    assert f"error: task eval refused: --model broken={broken}: {broken} {line}" in err, err
    assert err.count(line) == 1 and "Traceback" not in err, err
    (job,) = submitted_jobs(result.stdout).values()
    fields = job_fields(job)
    assert (fields["JobState"], fields["Restarts"]) == ("FAILED", "0"), fields  # max_requeues=1 allowed one
    logs_under = submitted_line(result.stdout).split("logs under ", 1)[1]
    batch = "".join(p.read_text() for p in job_logs(logs_under, fields["JobId"], (job, "0"))
                    if p.name.startswith("sbatch_"))
    assert "mlmclm: refused its input (exit 2): not requeued" in batch, batch
    assert not scenarios["eval_dirs"]["refused"].exists()  # refused before anything was written
    no_job_process_left(slurm_cluster)
