"""What each section of the GPU session runs (benchmarks/gpu_session.py calls `run_section`, one per process).

Each returns (status, result) and calls `write(result)` after every piece of work it can cut (a row, a head, a
run, a check), so that what is measured is on disk the moment it is; `deadline` (time.monotonic()) is when it must
be done: it checks it between pieces, and gpu_deadline cuts a piece that outlasts it (the section then ends "not
reached" with what it last wrote). On a machine without CUDA every section runs its CPU dry-run shapes and says so
("mode").
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import asdict
from pathlib import Path

GOAL_BF16_MFU = 0.45    # eurobert-1b, MLM, the training default, one H100/H200
GOAL_FP8_SPEEDUP = 1.3  # FP8 tokens/s over bf16 tokens/s, same configuration
# Of the features section's budget, the seconds its first part, the fine-tuning comparison, may take (a 610m model
# built on the GPU, two interleaved rounds of 8 steps per side, the sync count); the rest keeps what it had before.
FINETUNE_SHARE_S = 32


def _mode() -> str:
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu-dry-run"


def _work_dir(section: str) -> Path:
    """Scratch space for runs and checkpoints: never under OUT (the device sends all of OUT back). GPU_SESSION_WORK
    chooses where (the tests: their own temporary directory, which a killed session cannot leave behind)."""
    root = os.environ.get("GPU_SESSION_WORK")
    if root:
        Path(root).mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f"gpu_session_{section}_", dir=root))


def _peak(precision: str) -> tuple[float | None, str]:
    """Peak FLOP/s for MFU: the table's for this GPU; GPU_SESSION_PEAK_TFLOPS overrides (bf16; FP8 twice it)."""
    from mlmclm.flops import peak_flops

    override = os.environ.get("GPU_SESSION_PEAK_TFLOPS")
    scale = 2 if precision != "bf16" else 1
    try:
        value = None if override is None else float(override) * 1e12 * scale
        return peak_flops("fp8" if precision != "bf16" else "bf16", override=value), (
            "GPU_SESSION_PEAK_TFLOPS" if override else "mlmclm.flops.PEAK_FLOPS")
    except ValueError as err:
        return None, f"unknown: {err}"


def _parallel():
    from mlmclm.parallel import ParallelConfig, init_parallel

    init_parallel(ParallelConfig(), seed=1234)


def environment(out, deadline, write) -> tuple[str, dict]:
    from gpu_probe import environment as probe

    result = {"mode": _mode(), **probe()}
    if shutil.which("nvidia-smi"):
        try:
            result["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10).stdout.strip()
        except (subprocess.SubprocessError, OSError) as err:
            result["nvidia_smi"] = f"failed: {err}"
    smoke = result["te_smoke"]
    failed = [k for k, v in smoke.items() if isinstance(v, str) and v.startswith("failed")]
    return ("failed" if failed else "ok"), result


def _speed_cfg():
    from gpu_speed import SpeedConfig

    return SpeedConfig() if _mode() == "gpu" else SpeedConfig.smoke()


def speed_bf16(out, deadline, write) -> tuple[str, dict]:
    from gpu_speed import bf16_plan, run_rows

    cfg, (peak, source) = _speed_cfg(), _peak("bf16")
    result = {"mode": _mode(), "config": asdict(cfg), "peak_tflops": None if peak is None else peak / 1e12,
              "peak_source": source, "rows": []}
    _parallel()

    def on_row(rows):
        result["rows"] = [asdict(r) for r in rows]
        write(result)

    work = _work_dir("speed_bf16")
    try:
        rows = run_rows(cfg, bf16_plan(cfg), peak, deadline, on_row, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    on_row(rows)
    target = next((r for r in rows if r.model == "eurobert-1b" and r.objective == "mlm" and r.status == "ok"), None)
    result["goal_bf16_mfu_1b_mlm"] = {"target": GOAL_BF16_MFU, "measured": None if target is None else target.mfu}
    failed = [r for r in rows if r.status == "failed"]
    return ("failed" if failed else "ok"), result


def speed_fp8(out, deadline, write) -> tuple[str, dict]:
    from gpu_probe import fp8_recipes
    from gpu_speed import fp8_plan, ratios, run_rows

    cfg, (peak, source) = _speed_cfg(), _peak("fp8")
    support = fp8_recipes()
    result = {"mode": _mode(), "config": asdict(cfg), "peak_tflops": None if peak is None else peak / 1e12,
              "peak_source": source, "recipe_support": support, "rows": []}
    cfg.fp8_recipes = [r for r in cfg.fp8_recipes if support.get(r) is None]
    if support.get("delayed") is not None:
        result["skipped"] = f"FP8 does not run here: {support['delayed']}"
        return "ok", result
    _parallel()

    def on_row(rows):
        result["rows"] = [asdict(r) for r in rows]
        write(result)

    work = _work_dir("speed_fp8")
    try:
        rows = run_rows(cfg, fp8_plan(cfg), peak, deadline, on_row, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    on_row(rows)
    bf16 = out / "speed_bf16.json"
    baseline = json.loads(bf16.read_text())["result"]["rows"] if bf16.exists() else []
    result["fp8_over_bf16"] = ratios(rows, baseline)
    result["goal_fp8_speedup"] = {"target": GOAL_FP8_SPEEDUP,
                                  "measured": max((r["fp8_over_bf16"] for r in result["fp8_over_bf16"]), default=None)}
    return ("failed" if any(r.status == "failed" for r in rows) else "ok"), result


def _extras_cfg():
    from gpu_extras import ExtrasConfig

    return ExtrasConfig() if _mode() == "gpu" else ExtrasConfig.smoke()


def memory(out, deadline, write) -> tuple[str, dict]:
    from gpu_extras import worst_case_memory

    _parallel()
    result = {"mode": _mode()}

    def on_head(figures):
        write({**result, **figures})

    result.update(worst_case_memory(_extras_cfg(), "bf16" if _mode() == "gpu" else "fp32", on_head))
    return ("ok" if result["ok"] or "refused" in result else "failed"), result


def determinism(out, deadline, write) -> tuple[str, dict]:
    from determinism_check import DeterminismConfig, determinism_check

    cfg = DeterminismConfig(steps=12, switch=4, stop_after=6) if _mode() == "gpu" else DeterminismConfig.smoke()
    work = _work_dir("determinism")
    try:
        result = {"mode": _mode(), **determinism_check(cfg, work, lambda part: write({"mode": _mode(), **part}))}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ("ok" if result["passed"] else "failed"), result


def train_check(out, deadline, write) -> tuple[str, dict]:
    from gpu_train_check import run_checks

    work = _work_dir("train_check")
    result = {"mode": _mode(), "checks": []}

    def on_check(checks):
        result["checks"] = checks
        write(result)

    try:
        checks = run_checks(work, cpu=_mode() != "gpu", quick=True, deadline=deadline, on_check=on_check)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result["checks"] = checks
    return ("failed" if any(c["ok"] is False for c in checks) else "ok"), result


def features(out, deadline, write) -> tuple[str, dict]:
    """First the evaluation's fine-tuning against transformers' Trainer (gpu_finetune.py, issue 53) within
    FINETUNE_SHARE_S of the budget, then the rest of the training features with what is left (as before it)."""
    import time

    from gpu_extras import feature_table, precision_agreement
    from gpu_finetune import FinetuneBenchConfig, finetune_comparison

    bench = FinetuneBenchConfig() if _mode() == "gpu" else FinetuneBenchConfig.smoke()
    result = {"mode": _mode()}
    result["finetune"] = finetune_comparison(bench, min(deadline, time.monotonic() + FINETUNE_SHARE_S),
                                             lambda part: write({**result, "finetune": part}))
    write(result)
    cfg, (peak, _) = _extras_cfg(), _peak("bf16")
    _parallel()
    result["bf16_vs_fp32"] = precision_agreement(cfg, deadline)
    write(result)
    agreement = result["bf16_vs_fp32"]
    if "not_reached" in agreement:
        return "not reached", result
    result["features"] = feature_table(cfg, "bf16" if _mode() == "gpu" else "fp32", peak, deadline)
    failed = (agreement["error"] or not agreement["passed"] or "error" in result["features"]
              or "error" in result["finetune"])
    return ("failed" if failed else "not reached" if "not_reached" in result["finetune"] else "ok"), result


SECTION_RUNNERS = {"environment": environment, "speed_bf16": speed_bf16, "speed_fp8": speed_fp8, "memory": memory,
                   "determinism": determinism, "train_check": train_check, "features": features}


def run_section(name: str, out: Path, deadline: float, write) -> tuple[str, dict]:
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning, module="megatron.*")
    warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex|non-leaf Tensor).*")
    return SECTION_RUNNERS[name](out, deadline, write)
