"""benchmarks/gpu_check.py --smoke runs on CPU end to end and writes a complete, sane JSON report, including the
deterministic-runs comparison (two same-seed runs and a stop/resume through pretrain, step by step)."""
import json
import math
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
ROW_FIELDS = {"model", "precision", "objective", "seq_length", "micro_batch", "status", "reason", "fp8_attention",
              "fp8_attention_reason", "warmup_steps", "timed_steps", "seconds", "tokens_per_s", "flops_per_token",
              "tflops_per_gpu", "peak_tflops", "mfu", "peak_memory_gib", "first_loss", "last_loss"}
TOP_FIELDS = {"mode", "data", "environment", "peak_tflops", "peak_source", "memory_kind", "flop_convention", "fp8",
              "precision_agreement", "features", "worst_case_memory", "determinism", "runs", "goals", "config", "total_seconds", "failures", "ok"}


def run_smoke(tmp_path, *extra):
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--json", str(out), *extra],
                          capture_output=True, text=True, timeout=480)
    return proc, json.loads(out.read_text())


def test_smoke_report_is_complete_and_sane(tmp_path):
    proc, report = run_smoke(tmp_path, "--peak-tflops", "0.05")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert set(report) == TOP_FIELDS
    assert report["ok"] is True and report["failures"] == []
    assert report["mode"] == "smoke"
    env = report["environment"]
    for key in ("torch", "cuda", "transformer_engine", "apex", "megatron_core", "layer_spec", "layer_spec_reason"):
        assert key in env
    assert env["layer_spec"] in ("local", "transformer_engine")
    # One line says which fused kernels are on; without CUDA none is (each needs a GPU kernel).
    assert env["fused_kernels"].startswith(f"fused kernels ({env['layer_spec']} spec): on: ")
    assert "masked_softmax_fusion" in env["fused_kernels"] and env["fused_kernels"] in proc.stdout
    assert report["peak_tflops"]["bf16"] == 0.05 and report["peak_tflops"]["fp8"] == 0.1

    bf16 = [r for r in report["runs"] if r["precision"] == "bf16"]
    # Both objectives at both sequence lengths of the smoke shape.
    assert {(r["objective"], r["seq_length"]) for r in bf16} == {("mlm", 64), ("clm", 64), ("mlm", 128),
                                                                 ("clm", 128)}
    for row in report["runs"]:
        assert set(row) == ROW_FIELDS
    for row in bf16:
        assert row["status"] == "ok", row
        assert row["timed_steps"] >= 2 and row["seconds"] > 0
        assert row["tokens_per_s"] > 0 and row["tflops_per_gpu"] > 0 and row["flops_per_token"] > 0
        assert 0 < row["mfu"] and math.isclose(row["mfu"], row["tflops_per_gpu"] / 0.05, rel_tol=1e-9)
        assert row["peak_memory_gib"] > 0
        assert math.isfinite(row["first_loss"]) and math.isfinite(row["last_loss"])
        # Untrained on random tokens over a 256-token vocabulary: the loss is near ln(256) = 5.55.
        assert abs(row["last_loss"] - math.log(256)) < 1.0
    # Without CUDA, FP8 rows are present, skipped, and say why.
    fp8 = [r for r in report["runs"] if r["precision"] == "fp8"]
    assert len(fp8) == len(bf16) and all(r["status"] == "skipped" and r["reason"] for r in fp8)
    assert report["fp8"]["available"] is False and report["fp8"]["reason"]

    # Peak memory at the worst-case micro-batch (smoke: 3 samples of 32 tokens), next to the estimate.
    # Both heads: the training default (chunked) and megatron's whole head, each next to its own estimate.
    worst = report["worst_case_memory"]
    assert worst["tokens"] == 96 and "worst-case micro-batch" in proc.stdout
    assert {head: figures["head_chunk_tokens"] for head, figures in worst["heads"].items()} == {
        "chunked": 256, "whole": 0}
    for head, figures in worst["heads"].items():
        assert figures["status"] == "ok" and figures["measured_gib"] > 0, head
        assert figures["estimated_gib"] > 0 and "at 96 tokens" in figures["estimate"], head
        assert f"{head} head: measured" in proc.stdout
    assert worst["measured_gib"] == worst["heads"]["chunked"]["measured_gib"]  # the training default's figures

    agreement = report["precision_agreement"]
    assert agreement["passed"] is True
    assert len(agreement["fp32_losses"]) == len(agreement["bf16_losses"]) == agreement["steps"] > 0
    assert all(math.isfinite(x) for x in agreement["fp32_losses"] + agreement["bf16_losses"])
    assert 0 <= agreement["max_rel_diff"] <= agreement["rtol"]
    # bf16 is really a different precision: the losses are close but not identical.
    assert agreement["fp32_losses"] != agreement["bf16_losses"]
    assert all(g["measured"] is None for g in report["goals"].values())  # no goal is judged on CPU
    assert "model" in proc.stdout and "tok/s" in proc.stdout  # the table was printed

    # The features table: defaults, then each feature off, each with a speed and the defaults' speed-up over it.
    features = report["features"]
    assert "error" not in features
    assert [r["variant"] for r in features["rows"]] == ["defaults", "sparse MLM head off", "fused kernels off",
                                                        "manual GC (interval 100) off"]
    for row in features["rows"]:
        assert len(row["rounds"]) == features["rounds"] and row["tokens_per_s"] > 0 and row["mfu"] > 0
    rows = {r["variant"]: r for r in features["rows"]}
    assert rows["defaults"]["defaults_speedup"] == 1.0
    # The full head needs more FLOPs than the sparse one (LM head at every position, not 40 % of them).
    assert rows["sparse MLM head off"]["flops_per_token"] > rows["defaults"]["flops_per_token"]
    assert "features on vs off" in proc.stdout
    # Host synchronisations are counted by CUDA's sync debug mode, so only on a GPU; here the row says so.
    assert features["host_syncs_per_step"] is None
    assert "host synchronisations per step (defaults; target 1): - (no CUDA)" in proc.stdout

    # deterministic: true — on CPU both comparisons are bit-identical, every step, loss and gradient norm.
    det = report["determinism"]
    assert det["passed"] is True, det
    steps, stop = det["config"]["steps"], det["config"]["stop_after"]
    assert det["statuses"] == {"a": ["completed", steps], "b": ["completed", steps], "c stop": ["preempted", stop],
                               "c resume": ["completed", steps]}
    for key in ("same_seed", "stop_and_resume"):
        assert det[key]["bit_identical"] and det[key]["same_steps"] and det[key]["steps"] == steps
        assert det[key]["max_abs_loss_diff"] == 0.0 and det[key]["max_rel_grad_norm_diff"] == 0.0
    assert "stopped and resumed" in proc.stdout and "bit-identical" in proc.stdout


def test_a_failed_check_exits_nonzero_and_says_why(tmp_path):
    proc, report = run_smoke(tmp_path, "--agreement-rtol", "0", "--seq-lengths", "64", "--objectives", "mlm",
                             "--no-determinism")
    assert proc.returncode == 1
    assert report["ok"] is False
    assert report["precision_agreement"]["passed"] is False
    assert any("bf16 vs fp32" in f for f in report["failures"])
