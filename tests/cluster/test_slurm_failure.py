"""A run that fails on the nodes, on the real scheduler (slurm_scenarios.py): its data is unreadable, a refusal —
never requeued (it would be refused again, whatever `max_requeues` allows), FAILED, its message alone on the
launch's console. A crash's requeue as `max_requeues` allows: tests/parallel/test_torchrun_exit_codes.py runs the
same policy lines; the real scheduler requeues through them in the preemption scenario."""
import json

import pytest

from cluster.slurm_jobs import job_logs
from slurm_helpers import job_fields, no_job_process_left, submitted_jobs, submitted_line

# The first test to ask for `scenarios` runs every Slurm launch in its setup (slurm_scenarios.py): 5 min measured
# on this otherwise idle 2-core machine; under load it takes longer, and the suite-wide 600 s per test could cut it off.
pytestmark = pytest.mark.timeout(1800)


def test_a_refusing_rank_is_not_requeued_and_its_message_is_on_the_console(scenarios, slurm_cluster):
    result, broken = scenarios["failure"], scenarios["broken_data"]
    assert result.returncode == 2, result.stdout + result.stderr
    (job_id,) = submitted_jobs(result.stdout).values()
    err = result.stderr
    # bad data is a refusal (mlmclm.train.refusals): the console shows the trainer's own message, once, no traceback
    assert f"error: task tiny_clm_mlm refused: cannot read dataset manifest {broken / 'manifest.json'}" in err, err
    assert err.count("cannot read dataset manifest") == 1 and "Traceback" not in err, err
    fields = job_fields(job_id)
    assert (fields["JobState"], fields["Restarts"]) == ("FAILED", "0")  # max_requeues=1 would have allowed one
    logs_under = submitted_line(result.stdout).split("logs under ", 1)[1]
    batch = "".join(p.read_text() for p in job_logs(logs_under, job_id) if p.name.startswith("sbatch_"))
    assert "mlmclm: refused its input (exit 2): not requeued" in batch, batch
    status = json.loads((scenarios["failing_run"] / "run_status.json").read_text())
    assert status["status"] == "refused" and "manifest" in status["detail"]
    no_job_process_left(slurm_cluster)
