#!/usr/bin/env python
"""The GPU session in sections: everything one device command must bring back, most valuable first, each section in
its own process under its own timeout (benchmarks/gpu_session.sh runs them).

    python benchmarks/gpu_session.py start OUT           # writes OUT/summary.json (every section "not run"), prints
                                                         # the plan for the shell; stdlib only, instant
    python benchmarks/gpu_session.py run NAME --out OUT --budget-s S   # one section -> OUT/NAME.json
    python benchmarks/gpu_session.py finish OUT          # the summary: what ran, how long, what did not run

A section writes OUT/NAME.json the moment it ends (atomically: a kill leaves the previous complete file or none),
and after every piece of work it can cut ("status": "partial" until the end). OUT/summary.json is rewritten
at every section's start ("running") and end ("ok", "failed" or "not reached", seconds), so a kill at any moment
leaves every finished section on disk and the summary saying which did not run. Each section stops itself
`MARGIN_S` before its timeout: it checks its deadline between pieces of work, and gpu_deadline cuts a piece that
outlasts it — the section then ends "not reached" (never "failed") with what it had written. OUT holds only the
summary and one file per section (`MAX_FILES`: the device returns at most 8 files); logs, the install status and
scratch go to GPU_SESSION_WORK, and each section's JSON carries the tail of its log. Without CUDA every section
runs its CPU dry-run shapes (`"mode": "cpu-dry-run"`): how the session is tested
(tests/benchmarks/test_gpu_session.py, tests/benchmarks/test_gpu_deadlines.py).

Heavy imports (torch, megatron) happen inside `run` only: `start` and `finish` must not need them.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

from gpu_deadline import DeadlineReached, enforced

# (name, timeout in seconds, what it brings back). The order is the order of value.
INSTALL = ("install", 40, "the carried wheels, one pip call (only when wheel folders are given)")
SECTIONS = [
    ("environment", 30, "versions, device, layer spec, fused kernels, FP8 support per recipe (TE floors, CUDA), "
                        "the FP8-attention gate, a TE bf16/FP8 Linear smoke test"),
    ("speed_bf16", 95, "the training default's tokens/s, MFU, peak memory, host syncs per step: Trainer.step "
                        "fed through pretrain's batch path, chunked head, random-length samples as THD with the "
                        "fused RoPE, bf16; the attention and weight-gradient GEMM each row ran; eurobert-210m then "
                        "1b, MLM and CLM"),
    ("speed_fp8", 48, "the same with FP8 GEMMs (tensorwise, delayed; ratios to bf16), then FP8 attention where "
                      "the gate allows it (padded rows, delayed, head_dim 128) next to it off"),
    ("memory", 30, "peak memory at the worst-case micro-batch (24,576 tokens, CLM) against --plan's estimate, "
                   "chunked head and megatron's whole head"),
    ("determinism", 73, "deterministic: true — two same-seed runs and a stopped-and-resumed one through pretrain, "
                        "step by step"),
    ("train_check", 130, "torchrun + NCCL: SIGTERM preemption and resume (each launch ~45 s), HF export --verify "
                         "beside the resume, FP8 delayed save/resume (TE extra state), TE checkpoint keys, "
                         "per-document THD attention"),
    ("features", 60, "the evaluation's fine-tuning against transformers' Trainer (EncodEval's settings, bf16, "
                     "eurobert-610m: steps/s side by side, host syncs per run, runs per hour); then the rest: bf16 vs "
                     "fp32 losses; sparse head / fused kernels / manual GC on vs off"),
]
KILL_AFTER_S = 3    # `timeout -k`: SIGKILL this long after SIGTERM, to the section's whole process group
MARGIN_S = 8        # a section stops itself this long before its timeout
SHELL_TIMEOUTS = {"start": 5, "finish": 5}   # the shell's own short steps (literal `timeout N` there)
BUDGET_S = 540      # one device command is at most 600 s; this leaves a minute
MAX_FILES = 8       # what one device command brings back: OUT holds the summary and one JSON per section
LOG_TAIL_CHARS = 3000


def work_root() -> Path:
    """Where logs, the install status and scratch go (never OUT): GPU_SESSION_WORK, as the shell exports it."""
    return Path(os.environ.get("GPU_SESSION_WORK") or "/tmp/mlmclm_gpu_session")


def log_path(name: str) -> Path:
    return work_root() / "logs" / f"{name}.log"


def log_tail(name: str) -> str:
    try:
        return log_path(name).read_text(errors="replace")[-LOG_TAIL_CHARS:]
    except OSError:
        return ""


def worst_case_seconds() -> int:
    """The longest the shell can take: every timeout plus its kill-after, and the shell's own steps."""
    steps = [INSTALL] + SECTIONS
    return sum(t + KILL_AFTER_S for _, t, _ in steps) + sum(SHELL_TIMEOUTS.values())


def write_json(path: Path, data: dict) -> None:
    """Atomically: a reader (or a kill) sees the previous complete file or the new one, never half of one."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def _summary_path(out: Path) -> Path:
    return out / "summary.json"


def update_summary(out: Path, name: str, **fields) -> None:
    """One section's entry (sections run one at a time, so read-modify-write is safe)."""
    summary = json.loads(_summary_path(out).read_text())
    summary["sections"][name].update(fields)
    install = work_root() / "install.json"  # the shell's word on the wheels (written without Python)
    if install.exists() and summary["sections"]["install"]["status"] == "not run":
        summary["sections"]["install"].update(json.loads(install.read_text()))
    summary["not_run"] = [n for n, s in summary["sections"].items() if s["status"] in ("not run", "running")]
    write_json(_summary_path(out), summary)


ENDED = ("ok", "failed", "not reached", "not needed")


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
            entry["log_tail"] = log_tail(name)  # its own file has no word on why: its log's does
    summary["not_run"] = [n for n, s in summary["sections"].items() if s["status"] not in ENDED]
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
    deadline = started + budget_s
    update_summary(out, name, status="running")
    path = out / f"{name}.json"
    envelope = {"section": name, "status": "partial", "budget_s": budget_s}
    last = {"result": {}}
    final = threading.Lock()  # the section's last word is written once: by the main thread, or the timer's

    def write_file(result: dict, status: str) -> None:
        write_json(path, {**envelope, "status": status, "seconds": round(time.monotonic() - started, 1),
                          "result": result})

    def write(result: dict) -> None:  # the section's partial results, as they come
        last["result"] = result
        if not final.locked():  # never over the section's last word
            write_file(result, "partial")

    def conclude(status: str, result: dict) -> None:
        if not final.acquire(blocking=False):
            return
        envelope["mode"] = result.get("mode") or last["result"].get("mode")
        print(f"section {name}: {status} in {time.monotonic() - started:.0f} s -> {path}", flush=True)
        sys.stderr.flush()
        write_file({**result, "log_tail": log_tail(name)}, status)
        update_summary(out, name, status=status, seconds=round(time.monotonic() - started, 1), file=path.name)

    def stuck() -> None:  # the main thread is inside one long call: the timer thread concludes (gpu_deadline)
        conclude("not reached", {**last["result"], "not_reached": "the section's deadline came inside a call that "
                                                                 "did not return in time (the process was ended)"})

    status, result = "failed", {}
    try:
        with enforced(deadline, on_stuck=stuck):  # the heavy imports too: they count against the section's time
            from gpu_sections import run_section

            status, result = run_section(name, out, deadline, write)
    except DeadlineReached as err:  # cut by its deadline: what it wrote stands, and nothing failed
        status, result = "not reached", {**last["result"], "not_reached": str(err)}
    except BaseException as err:  # a section's own crash still leaves its file and the summary's word
        import traceback

        traceback.print_exc()
        result = {**last["result"], **result, "error": f"{type(err).__name__}: {str(err)[:500]}"}
    conclude(status, result)
    return 0 if status in ("ok", "not reached") else 1


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
    code = run(args.name, args.out, args.budget_s)
    # Everything is on disk: end now rather than wait for the interpreter's teardown (a chain thread still waiting
    # on a killed agent, torch's exit hooks), which would eat into the margin before the shell's `timeout`.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
