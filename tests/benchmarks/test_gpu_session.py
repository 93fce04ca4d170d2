"""benchmarks/gpu_session.sh, the one command a lent GPU runs, cannot rot: it fits one device command by
construction, runs end to end on CPU (every section in its dry-run shapes) within that budget, and a kill at any
moment leaves every finished section on disk with the summary saying which did not run."""
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_session.sh"
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_session  # noqa: E402
from mlmclm.model.head_chunks import DEFAULT_CHUNK_TOKENS  # noqa: E402

# The CPU dry run takes 3-4 minutes on the 2-core development machine; the session's own budget bounds it.
pytestmark = pytest.mark.timeout(900)


def test_every_timeout_adds_up_to_one_device_command():
    """Σ (section timeouts + their kill-after) + the shell's own steps <= 540 s; the shell's literal timeouts are
    the ones the plan counts, and nothing in it runs without a timeout."""
    assert gpu_session.worst_case_seconds() <= gpu_session.BUDGET_S == 540
    shell = SCRIPT.read_text()
    literal = [int(n) for n in re.findall(r"\btimeout (\d+)\b", shell)]
    assert sorted(literal) == sorted(gpu_session.SHELL_TIMEOUTS.values())
    python_calls = re.findall(r'^[^#\n]*"\$PY"[^\n]*$', shell, flags=re.M)
    assert python_calls and all("timeout" in line for line in python_calls), python_calls
    names = [name for name, _, _ in gpu_session.SECTIONS]
    assert names[:3] == ["environment", "speed_bf16", "speed_fp8"] and names[-1] == "features"  # by value
    assert all(t > gpu_session.MARGIN_S for _, t, _ in gpu_session.SECTIONS)
    assert len(names) + 1 <= gpu_session.MAX_FILES == 8  # OUT: the summary and one JSON per section
    # train_check: a stop and a resume, each a torchrun launch of ~45 s on a GPU (docs/gpu.md), must fit
    import gpu_train_check

    train_check = dict((n, t) for n, t, _ in gpu_session.SECTIONS)["train_check"]
    assert gpu_train_check.LAUNCH_S >= 45
    assert 2 * (gpu_train_check.LAUNCH_S + gpu_train_check.RUN_S) <= train_check - gpu_session.MARGIN_S


def _session(out: Path, **popen):
    env = {**os.environ, "PYTHON": sys.executable, "GPU_SESSION_PEAK_TFLOPS": "0.05", "CUDA_VISIBLE_DEVICES": "",
           "GPU_SESSION_WORK": str(out.parent / "work")}
    return subprocess.Popen(["bash", str(SCRIPT), str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, **popen)


def _sections(out: Path) -> dict:
    return {name: json.loads((out / f"{name}.json").read_text()) for name, _, _ in gpu_session.SECTIONS
            if (out / f"{name}.json").exists()}


def test_cpu_dry_run_of_the_whole_session(tmp_path):
    out = tmp_path / "session"
    began = time.monotonic()
    proc = _session(out)
    log, _ = proc.communicate(timeout=gpu_session.BUDGET_S + 60)
    seconds = time.monotonic() - began
    assert proc.returncode == 0, log[-4000:]
    assert seconds <= gpu_session.worst_case_seconds(), seconds
    summary = json.loads((out / "summary.json").read_text())
    assert summary["not_run"] == [] and summary["sections"]["install"]["status"] == "not needed"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["summary.json"] + [f"{name}.json" for name, _, _ in gpu_session.SECTIONS])  # <= 8 files come back
    sections = _sections(out)
    assert list(sections) == [name for name, _, _ in gpu_session.SECTIONS]  # every section wrote its file
    durations = {name: data["seconds"] for name, data in sections.items()}
    print("CPU dry run, seconds per section:", durations, f"total {seconds:.0f} s")
    for name, data in sections.items():
        assert data["status"] == summary["sections"][name]["status"] == "ok", (name, data["result"].get("error"))
        assert data["mode"] == "cpu-dry-run" and data["seconds"] <= summary["sections"][name]["timeout_s"]
        assert f"section {name}: ok" in data["result"]["log_tail"]  # its log, though logs stay on the device

    env = sections["environment"]["result"]
    assert env["layer_spec"] == "local" and env["te_smoke"] == {"skipped": "no CUDA device"}
    assert set(env["fp8_recipes"]) == {"delayed", "tensorwise", "mxfp8", "blockwise"}
    # The training default: the chunked head, random-length samples, MLM and CLM; each row names what ran — here
    # megatron's local layers (THD needs TE) and bf16 operands upcast for the weight gradient (CPU) — and was fed
    # by pretrain's batch path, the prefetch thread building every batch after the first.
    rows = sections["speed_bf16"]["result"]["rows"]
    assert [(r["objective"], r["head_chunk_tokens"], r["layout"], r["attention"], r["wgrad"]) for r in rows] == [
        (objective, DEFAULT_CHUNK_TOKENS, "random-length samples", "local", "fp32 upcast addmm")
        for objective in ("mlm", "clm")]
    for row in rows:
        assert row["status"] == "ok" and row["tokens_per_s"] > 0 and 0 < row["mfu"] < 1, row
        assert row["host_syncs_per_step"] is None  # CUDA's sync debug mode only counts on a GPU
        assert row["batch_path"].startswith("pretrain: PhaseLoaders + StepBatches")
        assert row["built_ahead"] >= row["timed_steps"]
    assert "FP8 does not run here" in sections["speed_fp8"]["result"]["skipped"]
    memory = sections["memory"]["result"]
    assert {h: f["status"] for h, f in memory["heads"].items()} == {"chunked": "ok", "whole": "ok"}
    assert all(f["estimated_gib"] > 0 and f["measured_gib"] > 0 for f in memory["heads"].values())
    determinism = sections["determinism"]["result"]
    assert determinism["passed"] and determinism["stop_and_resume"]["bit_identical"]
    checks = {c["check"]: c["ok"] for c in sections["train_check"]["result"]["checks"]}
    print("train_check on CPU:", checks)
    assert checks["SIGTERM to mlmclm.parallel.torchrun"] is True and False not in checks.values(), checks
    assert sections["features"]["result"]["bf16_vs_fp32"]["passed"] is True
    assert "did not run (or did not finish): none" in log and "speed_bf16: ok" in log


def test_a_kill_at_a_random_moment_leaves_every_finished_section(tmp_path):
    """SIGKILL to the whole session (what the end of a device lease does) at a random moment: every section that
    ended has its complete file and its status in the summary, the one running and the rest are listed as not run,
    and `finish` says so."""
    out = tmp_path / "session"
    moment = random.Random().uniform(20, 120)
    print(f"killing the session {moment:.0f} s after its start")
    proc = _session(out)
    try:  # a session that ends first is not waited for: the moment then falls after its end (nothing to kill)
        proc.communicate(timeout=moment)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    summary = json.loads((out / "summary.json").read_text())
    ended = [n for n, s in summary["sections"].items() if s["status"] in ("ok", "failed")]
    for name in ended:
        data = json.loads((out / f"{name}.json").read_text())
        assert data["status"] == summary["sections"][name]["status"], name
    names = [name for name, _, _ in gpu_session.SECTIONS]
    assert ended == names[:len(ended)]  # in order; all finished ones are on disk
    assert summary["not_run"] == names[len(ended):]
    for path in out.glob("*.json"):
        json.loads(path.read_text())  # no torn file: every write was atomic
    assert not list(out.glob("*.tmp*"))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_session.py"), "finish", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert ("did not run (or did not finish): " + (", ".join(names[len(ended):]) or "none")) in done.stdout
