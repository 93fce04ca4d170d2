"""The launcher tells a preempted task (saved, resumable: its ranks exit 75) from a failed one by the run's own
status file, since NeMo-Run reports both as FAILED."""
import json

from recipes.launch import preemption_report


def _status(run_dir, status, step):
    run_dir.mkdir(parents=True)
    (run_dir / "run_status.json").write_text(json.dumps({"status": status, "step": step, "detail": ""}))
    return str(run_dir)


def test_a_preempted_task_is_reported_as_such(tmp_path):
    dirs = {"clm": _status(tmp_path / "clm", "preempted", 1200)}
    report = preemption_report(["clm"], dirs)
    assert "task clm: PREEMPTED at step 1200" in report and dirs["clm"] in report


def test_a_failed_or_unknown_task_is_a_failure(tmp_path):
    dirs = {"clm": _status(tmp_path / "clm", "preempted", 10), "cpt": _status(tmp_path / "cpt", "failed", 3),
            "mlm": str(tmp_path / "never_started")}
    assert preemption_report(["clm", "cpt"], dirs) is None
    assert preemption_report(["mlm"], dirs) is None
