"""The GPU session's fine-tuning comparison (benchmarks/gpu_finetune.py, the first part of section `features`) on
CPU in its smoke shape: our loop's steps/s and runs per hour come back, the Trainer's side says why it did not run
where `accelerate` is absent, a deadline cuts it into "not reached" (never an error), and the report prints it."""
import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_report  # noqa: E402
from gpu_finetune import ENCODEVAL_STEPS, FinetuneBenchConfig, finetune_comparison  # noqa: E402


def test_the_comparison_on_cpu_brings_our_steps_and_says_why_the_trainer_did_not_run():
    written = []
    result = finetune_comparison(FinetuneBenchConfig.smoke(), time.monotonic() + 120, written.append)
    assert "error" not in result and "not_reached" not in result, result
    assert len(result["seconds"]["ours"]) == 1 and written  # written after each side's run
    ours = result["steps_per_s"]["ours"]
    assert ours > 0 and result["runs_per_hour"]["ours"] == 3600 * ours / ENCODEVAL_STEPS
    if importlib.util.find_spec("accelerate") is None:
        assert result["trainer"].startswith("not reached: accelerate absent") and not result["seconds"]["Trainer"]
    else:
        assert result["seconds"]["Trainer"] and result["ours_over_trainer"] > 0
    assert result["host_syncs_per_run"].startswith("not measured: no CUDA")
    lines = gpu_report._finetune(result)
    assert lines[0].startswith("  fine-tuning (tiny-test, bf16, 8 x 4 rows a step): ours ")
    assert "runs per hour at EncodEval's 1000 steps" in lines[1]


def test_a_spent_deadline_is_not_reached_never_an_error():
    result = finetune_comparison(FinetuneBenchConfig.smoke(), time.monotonic() - 1)
    assert result["not_reached"] == "the deadline came before the model was built" and "error" not in result
    assert gpu_report._finetune(result)[-1] == "  fine-tuning: the deadline came before the model was built"
