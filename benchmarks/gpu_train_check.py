#!/usr/bin/env python
"""The trainer on a real GPU, end to end: torchrun + NCCL, preemption, exact resume, FP8 checkpoints, HF export.

    python benchmarks/gpu_train_check.py --out artifacts/gpu_train_check      # one GPU
    python benchmarks/gpu_train_check.py --cpu --out /tmp/gtc                 # the same on CPU (gloo), to try it
    (the GPU session runs `run_checks` as its train_check section, --quick, under its deadline)

What the CPU test suite cannot show, checked on the device with the tiny model (correctness, not speed), in order
of value — with a deadline, a check that would not fit is recorded as skipped and one the deadline cut as not
reached (ok None both: a deadline is never a failure), never silently dropped:
1. `python -m mlmclm.parallel.torchrun` (1 rank, NCCL) trains CLM -> MLM in bf16, stopped by SIGTERM to our
   wrapper (exit 75 expected; without --quick also SIGUSR1 to plain torchrun with the Slurm executor's signal
   list), then finished; without --quick every step's loss is compared with an uninterrupted reference run
   (bit-identical expected: same kernels, same order; the largest difference otherwise); seconds from signal to
   exit; with TE, the checkpoint's real `_extra_state` keys are listed;
2. with TE, side by side with 1: an FP8 delayed-scaling run stopped and resumed (its extra state through our checkpoint guard and TE
   >= 2.18's refusal rule), and an FP8 tensorwise run; losses finite;
3. `tools/convert_to_hf.py --verify` on the checkpoint the stop saved, side by side with the resume (each launch
   costs ~45 s on a GPU: docs/gpu.md), then the export loaded by `transformers` on the GPU;
4. per-document attention equals each document alone (logits, bf16 tolerance), CLM and MLM: the local layers'
   block-diagonal mask, and with TE the THD packed format (not testable on CPU);
5. without --quick: the TE checkpoint resumed on megatron's local layers.
`on_check` sees the results after every check (the session writes them at once); `--out` gets report.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gpu_deadline  # noqa: E402
from mlmclm import quiet  # noqa: E402

quiet.install()

SEQ, TOTAL, SWITCH = 128, 12, 4
# What one `python -m mlmclm.parallel.torchrun` launch costs before its first step: ~45 s measured on the H200
# (docs/gpu.md: interpreter, imports, NCCL, model build, torch.compile of the fused kernels); a tiny model's steps
# then take seconds. A check is started only when its launch and steps fit before the deadline.
LAUNCH_S = 45
RUN_S = 15     # the tiny model's steps, a save and the exit
EXPORT_S = 30  # convert_to_hf --verify of the tiny model
SLURM_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"  # what cluster/executors.py gives torchrun


def config(run_dir: Path, data: Path, total: int = TOTAL, switch: int = SWITCH, **overrides) -> dict:
    cfg = {
        "run_dir": str(run_dir), "model": {"preset": "tiny"},
        "data": {"path": str(data), "tokenizer": "embedded"},
        "phases": [{"objective": {"kind": "clm"}, "steps": switch},
                   {"objective": {"kind": "mlm", "mask_ratio": 0.4}, "steps": total - switch}],
        "total_steps": total, "global_batch_size": 16, "micro_batch_size": 4,
        "precision": {"dtype": "bf16"},
        "optimizer": {"lr": 3e-3}, "schedule": {"style": "wsd", "warmup_steps": 2, "decay_steps": 4},
        "checkpoint": {"save_interval": 3}, "logging": {"log_interval": 1},
    }
    cfg.update(overrides)
    return cfg


class Checks:
    """The results so far; `on_check(results)` after each; `due(name, seconds)` says whether a check that needs
    about `seconds` still fits before the deadline (else it is recorded as skipped)."""

    def __init__(self, deadline: float = math.inf, on_check=None):
        self.results, self.deadline, self.on_check = [], deadline, on_check
        self.lock = threading.Lock()  # the chains record from their threads

    def record(self, name: str, ok: bool | None, **detail) -> bool:
        with self.lock:
            self.results.append({"check": name, "ok": None if ok is None else bool(ok), **detail})
            shown = ", ".join(f"{k}={v}" for k, v in detail.items() if k != "log_tail")
            print(f"[{'SKIP' if ok is None else 'PASS' if ok else 'FAIL'}] {name}: {shown}", flush=True)
            if ok is False and "log_tail" in detail:
                print(detail["log_tail"], flush=True)
            if self.on_check is not None:
                self.on_check(list(self.results))
        return bool(ok)

    def due(self, name: str, seconds: float) -> bool:
        if time.monotonic() + seconds <= self.deadline:
            return True
        self.record(name, None, skipped=f"the time budget was spent (needs ~{seconds:.0f} s)")
        return False

    def not_reached(self, name: str, **detail) -> bool:
        """A check the deadline cut: its process was killed (never a failure: the run did nothing wrong)."""
        self.record(name, None, not_reached="the section's deadline came before it ended", **detail)
        return False

    def left(self) -> float:
        return max(1.0, self.deadline - time.monotonic())


def launch(cfg: dict, out: Path, name: str, wrapper: bool = True, cpu: bool = False) -> tuple[subprocess.Popen, Path]:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")
    path = out / f"{slug}.json"
    path.write_text(json.dumps(cfg))
    log = out / f"{slug}.log"
    agent = [sys.executable, "-m", "mlmclm.parallel.torchrun"] if wrapper else \
        [sys.executable, "-m", "torch.distributed.run"]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PET_SIGNALS_TO_HANDLE": SLURM_SIGNALS,
           "PET_SHUTDOWN_TIMEOUT": "120"}
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.Popen(agent + ["--standalone", "--nproc-per-node", "1", "-m", "mlmclm.train", str(path)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                            start_new_session=True)  # its own group: a deadline kills agent and ranks together
    gpu_deadline.started_group(proc.pid)  # and so does the end of the section, whatever ends it
    return proc, log


def tail(log: Path, chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else ""


def logged_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def metrics(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row for row in rows}


def loss_of(row: dict) -> float:
    return next(v for k, v in row.items() if k.endswith("/loss"))


def _wait(proc: subprocess.Popen, timeout: float) -> int | None:
    """The exit code, or None after killing an agent that outlived `timeout` (its whole group: agent and ranks)."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        return None
    finally:
        gpu_deadline.ended_group(proc.pid)


def run_to_end(checks: Checks, name: str, cfg: dict, out: Path, cpu: bool) -> bool:
    proc, log = launch(cfg, out, name, cpu=cpu)
    start = time.monotonic()
    code = _wait(proc, checks.left())
    run_dir = Path(cfg["run_dir"])
    if code is None:
        return checks.not_reached(name, steps=logged_steps(run_dir), seconds=round(time.monotonic() - start, 1))
    ok = code == 0 and logged_steps(run_dir) == cfg["total_steps"]
    losses = [loss_of(r) for r in metrics(run_dir).values()] if (run_dir / "metrics.jsonl").exists() else []
    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    return checks.record(name, ok and finite, exit_code=code, steps=logged_steps(run_dir),
                         seconds=round(time.monotonic() - start, 1),
                         first_loss=losses[0] if losses else None, last_loss=losses[-1] if losses else None,
                         log_tail=tail(log))


def interrupt(checks: Checks, name: str, cfg: dict, out: Path, after_step: int, sig: int, wrapper: bool,
              cpu: bool) -> int | None:
    """Stop the run with `sig` to the agent once `after_step` is logged; the step it stopped at, or None."""
    run_dir = Path(cfg["run_dir"])
    proc, log = launch(cfg, out, name, wrapper=wrapper, cpu=cpu)
    while logged_steps(run_dir) < after_step:
        late = time.monotonic() > checks.deadline
        if proc.poll() is not None or late:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            gpu_deadline.ended_group(proc.pid)
            if late:
                checks.not_reached(name, steps=logged_steps(run_dir), waiting_for_step=after_step)
            else:
                checks.record(name, False, reason=f"no step {after_step} before the run ended", log_tail=tail(log))
            return None
        time.sleep(0.05)
    sent = time.monotonic()
    proc.send_signal(sig)
    code = _wait(proc, checks.left())
    seconds = round(time.monotonic() - sent, 2)
    if code is None:
        checks.not_reached(name, signal=signal.Signals(sig).name, seconds_after_signal=seconds)
        return None
    status_file = run_dir / "run_status.json"
    status = json.loads(status_file.read_text()) if status_file.exists() else {"status": "none", "step": None}
    expected = 75 if wrapper else None
    ok = status["status"] == "preempted" and (expected is None or code == expected)
    checks.record(name, ok, signal=signal.Signals(sig).name, exit_code=code, status=status["status"],
                  stopped_at=status["step"], signal_to_exit_s=seconds, log_tail=tail(log))
    return status["step"] if ok else None


def compare_losses(checks: Checks, name: str, run_dir: Path, reference: Path) -> None:
    ours, ref = metrics(run_dir), metrics(reference)
    steps_ok = sorted(ours) == sorted(ref)
    diffs = [abs(loss_of(ours[s]) - loss_of(ref[s])) for s in ref if s in ours]
    identical = steps_ok and all(d == 0.0 for d in diffs)
    checks.record(name, identical, steps=len(ours), max_abs_loss_diff=max(diffs) if diffs else None,
                  bit_identical=identical)


def export(checks: Checks, name: str, run_dir: Path, out_dir: Path) -> bool:
    log = out_dir.with_suffix(".log")
    with log.open("w") as handle:
        try:
            code = subprocess.call([sys.executable, "tools/convert_to_hf.py", str(run_dir), str(out_dir), "--verify"],
                                   stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT, timeout=checks.left())
        except subprocess.TimeoutExpired:  # subprocess.call killed it
            return checks.not_reached(name)
    return checks.record(name, code == 0, exit_code=code, log_tail=tail(log, 2000))


def load_export_on_device(checks: Checks, hf_dir: Path) -> None:
    import torch
    from transformers import AutoModelForMaskedLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        model = AutoModelForMaskedLM.from_pretrained(hf_dir, trust_remote_code=False).to(device).eval()
        ids = torch.randint(5, model.config.vocab_size, (2, 64), device=device)
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        checks.record("hf export loads and runs", bool(torch.isfinite(logits).all()), device=device,
                      model=type(model).__name__, logits_shape=list(logits.shape))
    except Exception as err:  # report, go on with the other checks
        checks.record("hf export loads and runs", False, error=f"{type(err).__name__}: {err}")


def te_extra_state_keys(checkpoint: Path) -> list[str]:
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(checkpoint)).read_metadata()
    return sorted(k for k in metadata.state_dict_metadata if "_extra_state" in k)


def _bf16_chain(checks: Checks, out: Path, data: Path, cpu: bool, quick: bool) -> None:
    """bf16 on TE layers when TE is there: stopped by a real signal through torchrun, resumed; its checkpoint's
    TE keys; exported. Quick (the session): no uninterrupted reference — the session's determinism section
    compares stopped and resumed runs step by step; here the stop comes through torchrun and the resume must end."""
    from mlmclm.model.precision import transformer_engine_available
    from mlmclm.train import checkpoint as ckpt

    reference = out / "reference"
    if not quick and checks.due("reference run (torchrun, 1 rank, bf16)", LAUNCH_S + RUN_S):
        run_to_end(checks, "reference run (torchrun, 1 rank, bf16)", config(reference, data), out, cpu)
    run_dir = out / "interrupted"
    cfg, stopped = config(run_dir, data), None
    if checks.due("SIGTERM to mlmclm.parallel.torchrun", LAUNCH_S + RUN_S):
        stopped = interrupt(checks, "SIGTERM to mlmclm.parallel.torchrun", cfg, out, 5, signal.SIGTERM, True, cpu)
    if stopped is not None and not quick and \
            checks.due("SIGUSR1 to plain torchrun (Slurm signals)", LAUNCH_S + RUN_S):
        stopped = interrupt(checks, "SIGUSR1 to plain torchrun (Slurm signals)", cfg, out, stopped + 3,
                            signal.SIGUSR1, False, cpu)
    if stopped is None:
        return
    # The export reads the checkpoint the stop saved while the resume runs (no checkpoint is pruned: keep_last is
    # unset): two launches side by side instead of one after the other.
    saved = run_dir / "checkpoints" / f"iter_{stopped:07d}"
    exporting = None
    if checks.due("convert_to_hf --verify", EXPORT_S):
        exporting = threading.Thread(target=lambda: export(checks, "convert_to_hf --verify", saved, out / "hf")
                                     and load_export_on_device(checks, out / "hf"), name="export")
        exporting.start()
    try:
        if not checks.due("resumed to the end", LAUNCH_S + RUN_S) or \
                not run_to_end(checks, "resumed to the end", cfg, out, cpu):
            return
        if not quick:
            compare_losses(checks, "stopped and resumed vs uninterrupted: every step's loss", run_dir, reference)
        if transformer_engine_available()[0]:
            keys = te_extra_state_keys(ckpt.latest_checkpoint(run_dir / "checkpoints"))
            checks.record("TE checkpoint _extra_state keys", True, count=len(keys), sample=keys[:6])
        if not quick and transformer_engine_available()[0] and \
                checks.due("TE checkpoint resumed on local layers (+4 steps)", LAUNCH_S + RUN_S):
            # The TE checkpoint continued on local layers (use_te may change on resume): strict keys on real TE.
            longer = config(run_dir, data, total=TOTAL + 4, use_te=False,
                            checkpoint={"save_interval": 4,
                                        "allow_resume_changes": ["total_steps", "phases", "schedule"]})
            run_to_end(checks, "TE checkpoint resumed on local layers (+4 steps)", longer, out, cpu)
    finally:
        if exporting is not None:
            exporting.join()


FP8 = {"dtype": "bf16", "fp8": "hybrid", "fp8_recipe": "delayed"}


def _fp8_delayed_chain(checks: Checks, out: Path, data: Path, cpu: bool, quick: bool) -> None:
    """Delayed scaling's amax history is checkpoint state: stopped, saved, resumed through our checkpoint guard
    and TE >= 2.18's refusal rule (which our loader opens for vetted payloads only)."""
    cfg = config(out / "fp8_delayed", data, total=8, switch=3, use_te=True, precision=FP8,
                 checkpoint={"save_interval": 2})
    if checks.due("FP8 delayed stopped by SIGTERM", LAUNCH_S + RUN_S):
        if interrupt(checks, "FP8 delayed stopped by SIGTERM", cfg, out, 4, signal.SIGTERM, True, cpu) is not None:
            if checks.due("FP8 delayed resumed (extra state through the guard)", LAUNCH_S + RUN_S):
                run_to_end(checks, "FP8 delayed resumed (extra state through the guard)", cfg, out, cpu)


def _fp8_tensorwise_chain(checks: Checks, out: Path, data: Path, cpu: bool, quick: bool) -> None:
    if checks.due("FP8 tensorwise (8 steps)", LAUNCH_S + RUN_S):
        cfg = config(out / "fp8_tensorwise", data, total=8, switch=3, use_te=True,
                     precision={**FP8, "fp8_recipe": "tensorwise"})
        run_to_end(checks, "FP8 tensorwise (8 steps)", cfg, out, cpu)


def run_checks(out: Path, cpu: bool, quick: bool, deadline: float = math.inf, on_check=None,
               skip_te: bool = False) -> list[dict]:
    """Every check under `deadline` (time.monotonic()); the results, each with `ok` True, False or None (skipped,
    saying why). The bf16 and FP8 chains run side by side (each its own runs, processes and directories: one GPU
    holds them all), each in order of value; then per-document attention."""
    from concurrent.futures import ThreadPoolExecutor

    from document_attention_check import document_attention_check
    from mlmclm.data.prepare import prepare_embedded_corpus
    from mlmclm.model.precision import transformer_engine_available

    checks = Checks(deadline, on_check)
    data = out / "data"
    prepare_embedded_corpus(data, seq_length=SEQ, max_tokens=60_000)  # 12 steps x 16 x 128 = 24,576 tokens
    chains = [_bf16_chain]
    te, why = transformer_engine_available()
    if te and not skip_te:
        chains += [_fp8_delayed_chain, _fp8_tensorwise_chain]
    elif not te:
        checks.record("transformer engine (FP8 checkpoints and runs)", None, skipped=f"not importable here: {why}")
    with ThreadPoolExecutor(len(chains), thread_name_prefix="check") as pool:
        futures = {chain.__name__: pool.submit(chain, checks, out, data, cpu, quick) for chain in chains}
        for name, done in futures.items():
            try:
                done.result()
            except Exception as err:  # one chain's crash is its failure, not the others'
                checks.record(f"{name} crashed", False, error=f"{type(err).__name__}: {err}")
    for use_te in ([False, True] if te else [False]):
        if checks.due(f"per-document attention ({'TE, THD' if use_te else 'local layers, mask'})", 15):
            document_attention_check(checks, out, use_te=use_te)
    return checks.results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="an empty or new directory for runs and report")
    parser.add_argument("--cpu", action="store_true", help="run on CPU (gloo) to try the script without a GPU")
    parser.add_argument("--skip-te", action="store_true")
    parser.add_argument("--quick", action="store_true", help="one stop (SIGTERM) instead of two; no TE-on-local resume")
    parser.add_argument("--budget-s", type=float, help="stop starting checks after this long (the rest: skipped)")
    args = parser.parse_args(argv)
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("error: no CUDA device (use --cpu to try the script on CPU)", file=sys.stderr)
        return 2
    if args.out.exists() and any(args.out.iterdir()):
        print(f"error: {args.out} is not empty; give a new directory", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    env = {"torch": torch.__version__, "cuda": torch.version.cuda,
           "device": torch.cuda.get_device_name() if torch.cuda.is_available() and not args.cpu else "cpu"}
    report = args.out / "report.json"

    def write(results):
        tmp = report.with_name("report.json.tmp")
        tmp.write_text(json.dumps({"environment": env, "checks": results,
                                   "ok": all(r["ok"] is not False for r in results)}, indent=2))
        os.replace(tmp, report)

    deadline = math.inf if args.budget_s is None else time.monotonic() + args.budget_s
    results = run_checks(args.out, args.cpu, args.quick, deadline, write, args.skip_te)
    write(results)
    failed = [r["check"] for r in results if r["ok"] is False]
    skipped = [r["check"] for r in results if r["ok"] is None]
    print(f"{len(results) - len(failed) - len(skipped)}/{len(results)} checks passed"
          + (f"; FAILED: {failed}" if failed else "") + (f"; skipped: {skipped}" if skipped else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
