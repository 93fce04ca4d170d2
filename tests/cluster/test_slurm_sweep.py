"""The tiny grid on the real scheduler (`python -m recipes grid tiny --executor slurm`, slurm_scenarios.py): each job
waits for what it starts from through Slurm's afterok — the continued pretraining for its decayed parent, the
branch for the segment that writes its branch point — and starts from that checkpoint."""
import json

import pytest

from cluster.slurm_jobs import job_logs
from slurm_helpers import job_fields, no_job_process_left, submitted_jobs

# The first test to ask for `scenarios` runs every Slurm launch in its setup (slurm_scenarios.py): 5 min measured
# on this otherwise idle 2-core machine; under load it takes longer, and the suite-wide 600 s per test could cut it off.
pytestmark = pytest.mark.timeout(1800)


def test_the_tiny_grid_waits_for_its_parents_on_slurm(scenarios, slurm_cluster, shared):
    result, root = scenarios["sweep"], scenarios["grid_root"]
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    jobs = submitted_jobs(result.stdout)
    clm, segment = "tiny-clm-4", "tiny-clm-4-until-2"
    cpt, branch = "tiny-clm-dec4-mlm40-6", "tiny-clm-2-mlm40-4"
    assert set(jobs) == {clm, segment, "tiny-mlm40-4", branch, cpt}
    fields = {name: job_fields(job_id) for name, job_id in jobs.items()}
    assert all(f["JobState"] == "COMPLETED" and f["Restarts"] == "0" for f in fields.values()), fields
    # held by the scheduler until the parent succeeded, then started
    assert f"job {jobs[cpt]} ({cpt}): PENDING (Dependency)" in result.stdout
    for child, parent in ((cpt, clm), (branch, segment), (clm, segment)):
        assert fields[child]["StartTime"] >= fields[parent]["EndTime"], (child, parent, fields)
    logs = "\n".join(p.read_text(errors="replace") for p in job_logs(shared / "nemorun", jobs[cpt]))
    assert f"initialised weights from {root / clm / 'checkpoints' / 'iter_0000004'}" in logs
    logs = "\n".join(p.read_text(errors="replace") for p in job_logs(shared / "nemorun", jobs[branch]))
    assert f"branched from {root / clm / 'checkpoints' / 'iter_0000002'} at step 2" in logs
    for name in (clm, "tiny-mlm40-4", branch, cpt):
        assert json.loads((root / name / "run_status.json").read_text())["status"] == "completed", name
    no_job_process_left(slurm_cluster)
