"""A run that fails on the nodes, on the real scheduler (slurm_scenarios.py): requeued only as often as
`max_requeues` allows, then FAILED; its data is unreadable, a refusal, whose message alone is on the launch's console."""
import json

import pytest

from slurm_helpers import job_fields, no_job_process_left, submitted_jobs

# The first test to ask for `scenarios` runs every Slurm launch in its setup (slurm_scenarios.py): 5 min measured
# on this otherwise idle 2-core machine; under load it takes longer, and the suite-wide 600 s per test could cut it off.
pytestmark = pytest.mark.timeout(1800)


def test_a_raising_rank_is_not_requeued_without_end_and_its_error_is_on_the_console(scenarios, slurm_cluster):
    result, broken = scenarios["failure"], scenarios["broken_data"]
    assert result.returncode == 2, result.stdout + result.stderr
    (job_id,) = submitted_jobs(result.stdout).values()
    err = result.stderr
    # bad data is a refusal (mlmclm.train.refusals): the console shows the trainer's own message, once, no traceback
    assert f"error: task tiny_clm_mlm refused: cannot read dataset manifest {broken / 'manifest.json'}" in err, err
    assert err.count("cannot read dataset manifest") == 1 and "Traceback" not in err, err
    fields = job_fields(job_id)
    assert (fields["JobState"], fields["Restarts"]) == ("FAILED", "1")  # requeued only as max_requeues allows
    status = json.loads((scenarios["failing_run"] / "run_status.json").read_text())
    assert status["status"] == "refused" and "manifest" in status["detail"]
    no_job_process_left(slurm_cluster)
