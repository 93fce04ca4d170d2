"""A run that fails on the nodes, on the real scheduler (slurm_scenarios.py): requeued only as often as
`max_requeues` allows, then FAILED, and its own error is on the console of the launch (with the log it comes from)."""
import json

import pytest

from slurm_helpers import job_fields, no_job_process_left, submitted_jobs

# The first test to ask for `scenarios` runs every Slurm launch in its setup (slurm_scenarios.py): 5 min measured
# on this otherwise idle 2-core machine; under load it takes longer, and the suite-wide 600 s per test could cut it off.
pytestmark = pytest.mark.timeout(1800)


def test_a_raising_rank_is_not_requeued_without_end_and_its_error_is_on_the_console(scenarios, slurm_cluster):
    result, broken = scenarios["failure"], scenarios["broken_data"]
    assert result.returncode == 1, result.stdout + result.stderr
    (job_id,) = submitted_jobs(result.stdout).values()
    err = result.stderr
    # the console says what happened and shows the rank's own error, from the log of the last start
    assert "task tiny_clm_mlm: FAILED" in err and "restarted 1×" in err, err
    assert f"cannot read dataset manifest {broken / 'manifest.json'}" in err, err
    assert f"_{job_id}_1.out)" in err  # the log it comes from: the second start's
    assert "not requeued (max_requeues=1)" in err
    fields = job_fields(job_id)
    assert (fields["JobState"], fields["Restarts"]) == ("FAILED", "1")
    status = json.loads((scenarios["failing_run"] / "run_status.json").read_text())
    assert status["status"] == "failed" and "manifest" in status["detail"]
    no_job_process_left(slurm_cluster)
