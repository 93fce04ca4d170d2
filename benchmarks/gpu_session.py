#!/usr/bin/env python
"""The GPU session in sections: everything one device command must bring back, most valuable first, each section in
its own process under its own timeout (benchmarks/gpu_session.sh runs them).

    python benchmarks/gpu_session.py start OUT           # writes OUT/summary.json (every section "not run"), prints
                                                         # the plan for the shell; stdlib only, instant
    python benchmarks/gpu_session.py run NAME --out OUT --budget-s S   # one section -> OUT/NAME.json
    python benchmarks/gpu_session.py finish OUT          # the summary: what ran, how long, what did not run

A section writes OUT/NAME.json the moment it ends (atomically: a kill leaves the previous complete file or none),
and the long ones after every row they measure ("status": "partial" until the end). OUT/summary.json is rewritten
at every section's start ("running") and end ("ok"/"failed", seconds), so a kill at any moment leaves every
finished section on disk and the summary saying which did not run. Each section stops itself `MARGIN_S` before
its timeout, skipping what is left with the reason. Without CUDA every section runs its CPU dry-run shapes
(`"mode": "cpu-dry-run"`): how the session is tested (tests/benchmarks/test_gpu_session.py).

Heavy imports (torch, megatron) happen inside `run` only: `start` and `finish` must not need them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# (name, timeout in seconds, what it brings back). The order is the order of value.
INSTALL = ("install", 40, "the carried wheels, one pip call (only when wheel folders are given)")
SECTIONS = [
    ("environment", 35, "versions, device, layer spec, fused kernels, FP8 support per recipe (TE floors, CUDA), "
                        "the FP8-attention gate, a TE bf16/FP8 Linear smoke test"),
    ("speed_bf16", 110, "the training default's tokens/s, MFU, peak memory, host syncs per step: Trainer.step, "
                        "chunked head (256), random-length samples as THD with the fused RoPE, bf16; "
                        "eurobert-210m then 1b, MLM and CLM"),
    ("speed_fp8", 90, "the same with FP8 GEMMs (tensorwise, delayed; ratios to bf16), then FP8 attention where "
                      "the gate allows it (padded rows, delayed, head_dim 128) next to it off"),
    ("memory", 45, "peak memory at the worst-case micro-batch (24,576 tokens, CLM) against --plan's estimate, "
                   "chunked head and megatron's whole head"),
    ("determinism", 80, "deterministic: true — two same-seed runs and a stopped-and-resumed one through pretrain, "
                        "step by step"),
    ("train_check", 80, "torchrun + NCCL: SIGTERM preemption and exact resume, FP8 delayed save/resume (TE extra "
                        "state), TE checkpoint keys, HF export --verify, per-document THD attention"),
    ("features", 20, "the rest: sparse head / fused kernels / manual GC on vs off; bf16 vs fp32 losses"),
]
KILL_AFTER_S = 3    # `timeout -k`: SIGKILL this long after SIGTERM, to the section's whole process group
MARGIN_S = 8        # a section stops itself this long before its timeout
SHELL_TIMEOUTS = {"start": 5, "finish": 5}   # the shell's own short steps (literal `timeout N` there)
BUDGET_S = 540      # one device command is at most 600 s; this leaves a minute


def worst_case_seconds() -> int:
    """The longest the shell can take: every timeout plus its kill-after, and the shell's own steps."""
    steps = [INSTALL] + SECTIONS
    return sum(t + KILL_AFTER_S for _, t, _ in steps) + sum(SHELL_TIMEOUTS.values())


def write_json(path: Path, data: dict) -> None:
    """Atomically: a reader (or a kill) sees the previous complete file or the new one, never half of one."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def _summary_path(out: Path) -> Path:
    return out / "summary.json"


def update_summary(out: Path, name: str, **fields) -> None:
    """One section's entry (sections run one at a time, so read-modify-write is safe)."""
    summary = json.loads(_summary_path(out).read_text())
    summary["sections"][name].update(fields)
    install = out / "install.json"  # the shell's word on the wheels (written without Python)
    if install.exists() and summary["sections"]["install"]["status"] == "not run":
        summary["sections"]["install"].update(json.loads(install.read_text()))
    summary["not_run"] = [n for n, s in summary["sections"].items() if s["status"] in ("not run", "running")]
    write_json(_summary_path(out), summary)


def start(out: Path) -> str:
    """Writes the summary with every section not run; returns the plan the shell reads."""
    out.mkdir(parents=True, exist_ok=True)
    sections = {name: {"status": "not run", "timeout_s": t, "what": what} for name, t, what in [INSTALL] + SECTIONS}
    write_json(_summary_path(out), {"budget_s": BUDGET_S, "worst_case_s": worst_case_seconds(),
                                    "started": time.strftime("%Y-%m-%d %H:%M:%S"), "sections": sections,
                                    "not_run": list(sections)})
    lines = [f"kill_after {KILL_AFTER_S}", f"margin {MARGIN_S}"]
    lines += [f"{'install' if name == 'install' else 'section'} {name} {t}" for name, t, _ in [INSTALL] + SECTIONS]
    cudnn = _torch_cudnn_path()
    if cudnn:
        lines.append(f"env CUDNN_PATH={cudnn}")
    return "\n".join(lines)


def _torch_cudnn_path() -> str | None:
    """torch's own (pip) cuDNN, for TE to load instead of a system one older than torch's (a namespace package:
    importing it loads nothing)."""
    if os.environ.get("CUDNN_PATH"):
        return None
    try:
        import nvidia.cudnn as cudnn
        return list(cudnn.__path__)[0]
    except Exception:
        return None


def finish(out: Path) -> int:
    update_summary(out, "install")  # folds in the shell's install.json
    summary = json.loads(_summary_path(out).read_text())
    for name, entry in summary["sections"].items():
        if entry["status"] == "running":  # started, never ended: its timeout (or a kill) stopped it
            entry["status"] = "timed out or killed"
    summary["not_run"] = [n for n, s in summary["sections"].items() if s["status"] not in ("ok", "failed",
                                                                                         "not needed")]
    summary["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write_json(_summary_path(out), summary)
    print(f"{'section':<14}{'status':<22}{'seconds':>9}{'timeout':>9}")
    for name, entry in summary["sections"].items():
        seconds = entry.get("seconds")
        print(f"{name:<14}{entry['status']:<22}{'-' if seconds is None else f'{seconds:.0f}':>9}"
              f"{entry['timeout_s']:>9}")
    print("did not run (or did not finish): " + (", ".join(summary["not_run"]) or "none"))
    from gpu_report import report

    print(report(out))
    return 0


def run(name: str, out: Path, budget_s: float) -> int:
    if name not in {n for n, _, _ in SECTIONS}:
        print(f"error: unknown section {name!r}", file=sys.stderr)
        return 2
    started = time.monotonic()
    update_summary(out, name, status="running")
    path = out / f"{name}.json"
    envelope = {"section": name, "status": "partial", "budget_s": budget_s}

    def write(result: dict, status: str = "partial") -> None:
        write_json(path, {**envelope, "status": status, "seconds": round(time.monotonic() - started, 1),
                          "result": result})

    status, result = "failed", {}
    try:
        from gpu_sections import run_section

        status, result = run_section(name, out, started + budget_s, write)
        envelope["mode"] = result.get("mode")
    except BaseException as err:  # a section's own crash still leaves its file and the summary's word
        import traceback

        traceback.print_exc()
        result = {**result, "error": f"{type(err).__name__}: {str(err)[:500]}"}
    write(result, status)
    update_summary(out, name, status=status, seconds=round(time.monotonic() - started, 1), file=path.name)
    print(f"section {name}: {status} in {time.monotonic() - started:.0f} s -> {path}")
    return 0 if status == "ok" else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("start").add_argument("out", type=Path)
    sub.add_parser("finish").add_argument("out", type=Path)
    one = sub.add_parser("run")
    one.add_argument("name")
    one.add_argument("--out", type=Path, required=True)
    one.add_argument("--budget-s", type=float, required=True)
    args = parser.parse_args(argv)
    if args.command == "start":
        print(start(args.out))
        return 0
    if args.command == "finish":
        return finish(args.out)
    return run(args.name, args.out, args.budget_s)


if __name__ == "__main__":
    sys.exit(main())
