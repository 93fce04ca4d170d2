"""The CLM detour family on the real local Slurm (issue 57 part 4), launched as a user types it
(`python -m recipes detour tiny ... --tasks FILE --executor slurm`, bare-metal, CPU ranks): seven jobs in one
dependency chain — import, then detour and control side by side, each export after its run, the evaluation's job
array after both exports, the report after it — every one COMPLETED, none started before what it waits for ended,
and the report with the held-out loss beside both runs' downstream scores over two fine-tuning seeds.

Not one of slurm_scenarios' launches: it runs on its own after them (the family is 7 jobs of its own)."""
import json
import subprocess

import pytest

from slurm_helpers import SLURM_ARGS, job_fields, no_job_process_left, recipes_command, submitted_jobs

# An import, two runs of 3 steps, two exports, 4 fine-tunings of 2 steps, the report: 139 s on this 2-core machine
# idle with two ranks a run (the cluster's start excluded). One rank a run and one for the step-0 measurement: the
# test is about the chain on Slurm; the detour's two ranks are tests/recipes/test_detour_recipe.py's.
pytestmark = pytest.mark.timeout(1800)

CHAIN = {"import": [], "detour": ["import"], "control": ["import"], "export-detour": ["detour"],
         "export-control": ["control"], "eval": ["export-detour", "export-control"], "report": ["eval"]}


def test_the_detour_family_runs_as_one_dependency_chain(slurm_cluster, launch_env, shared):
    from recipes import detour
    from recipes.detour_run import prepare_twin_data
    from tests.eval.eval_fixtures import make_task_folder

    source = detour.make_tiny_modernbert(shared / "detour_source")
    data = prepare_twin_data(shared / "detour_data", None, source)
    tasks = shared / "detour_tasks.json"
    tasks.write_text(json.dumps([{"name": "sentiment", "family": "classification", "max_length": 32, "path": str(
        make_task_folder(shared / "detour_sentiment", "classification", sizes=(16, 8, 8)))}]))
    root = shared / "detour"
    result = subprocess.run(recipes_command(
        "detour", "tiny", "--root", str(root), "--source", str(source), "--data-path", str(data), "steps=2",
        "decay_share=0.5", "validation_samples=8", "processes=1", "--tasks", str(tasks), "--lrs", "1e-3", "--max-steps", "2",
        "--batch-size", "8", "--seeds", "0", "1", *SLURM_ARGS, "executor.cpus_per_task=2"),
        env=launch_env, capture_output=True, text=True, timeout=1500)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    jobs = submitted_jobs(result.stdout)
    assert set(jobs) == set(CHAIN), result.stdout
    fields = {name: job_fields(job_id) for name, job_id in jobs.items()}
    assert all(f["JobState"] == "COMPLETED" for f in fields.values()), fields
    for child, parents in CHAIN.items():  # held by the scheduler until each job it reads had ended
        assert all(fields[child]["StartTime"] >= fields[parent]["EndTime"] for parent in parents), (child, fields)
    report = json.loads((root / "report.json").read_text())
    assert report["step0"] is not None and report["phase1_steps"] == 2 and report["total_steps"] == 3
    for name in ("detour", "control"):
        assert None not in report[name].values(), report
        cell = report["downstream"]["runs"][name]["sentiment"]
        assert cell["seeds"] == 2 and cell["ci95"] is not None, report
    text = (root / "report.md").read_text()
    assert f"| detour | {report['detour']['end']:.4f} | " in text, text
    assert json.loads((root / "detour_plan.json").read_text())["total_steps"] == 3  # `detour report` reads it
    no_job_process_left(slurm_cluster)
