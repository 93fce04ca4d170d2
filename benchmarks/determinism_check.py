"""Is a run bit-reproducible with `deterministic: true`? Two same-seed runs and a stopped-and-resumed one, compared
step by step (loss and gradient norm) — what an H200 session could not tell apart: two same-seed runs drifted from
step 5, and one resumed step read 9.22 against 6.46.

Every run goes through `pretrain`: the training step, its stop flag, the checkpoint and the resume that training
uses. Four process launches, one run each: reference A, reference B (its own process, so it compiles and picks its
kernels anew, as a second job would), run C stopped after `stop_after` steps by SIGUSR1 sent from inside that step
(the preemption path: the flag is agreed at the step's read, C saves and exits) — these three side by side — then C
resumed in a fresh process.
The GPU session runs this as its determinism section; without CUDA with a tiny shape. The runs are forked from
a fork server that imported torch once, and nothing that asks CUDA (forking the caller itself hung after its own
training on CPU, and cannot be done once CUDA is up; a server that had imported megatron poisoned every fork).
"""
from __future__ import annotations

import json
import math
import multiprocessing
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class DeterminismConfig:
    steps: int = 24
    switch: int = 8          # CLM for the first `switch` steps, then MLM: the resume crosses no switch, the runs do
    stop_after: int = 10
    seq_length: int = 128
    global_batch: int = 16
    micro_batch: int = 4
    dtype: str = "bf16"      # the H200 session's regime
    seed: int = 1234

    @classmethod
    def smoke(cls) -> "DeterminismConfig":
        return cls(steps=5, switch=2, stop_after=3, seq_length=64, global_batch=4, micro_batch=2)


def run_config(cfg: DeterminismConfig, run_dir: Path, data: Path) -> dict:
    return {
        "run_dir": str(run_dir), "model": {"preset": "tiny"}, "seed": cfg.seed, "deterministic": True,
        "data": {"path": str(data), "tokenizer": "embedded"},
        "phases": [{"objective": {"kind": "clm"}, "steps": cfg.switch},
                   {"objective": {"kind": "mlm", "mask_ratio": 0.4}, "steps": cfg.steps - cfg.switch}],
        "total_steps": cfg.steps, "global_batch_size": cfg.global_batch, "micro_batch_size": cfg.micro_batch,
        "precision": {"dtype": cfg.dtype},
        "optimizer": {"lr": 3e-3}, "schedule": {"style": "wsd", "warmup_steps": 2, "decay_steps": 2},
        "checkpoint": {"save_interval": None}, "logging": {"log_interval": 1000, "tensorboard": False},
    }


def _train(cfg_dict: dict, stop_after: int | None) -> None:
    """One process's run (spawned; module-level so that it pickles)."""
    import warnings

    warnings.filterwarnings("ignore")
    from mlmclm.train import pretrain as pt
    from mlmclm.train.config import TrainConfig

    if stop_after is not None:
        original, calls = pt.train_step, {"n": 0}

        def train_step(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == stop_after:
                os.kill(os.getpid(), signal.SIGUSR1)  # handled before this step's stop flag is read
            return original(*args, **kwargs)

        pt.train_step = train_step
    pt.pretrain(TrainConfig.from_dict(cfg_dict))


def refuse_bad_fork() -> None:
    """Raises in a child forked after its parent asked CUDA anything: torch would refuse to initialise CUDA there
    ("Cannot re-initialize CUDA in forked subprocess"), deep inside the run's setup."""
    import torch

    if torch._C._cuda_isInBadFork():
        raise RuntimeError("this run was forked after its parent asked CUDA for its devices: the fork server must "
                           "preload nothing that does (see FORK_SERVER_PRELOAD)")


def _in_new_process(cfg_dict: dict, stop_after: int | None, port: int) -> None:
    refuse_bad_fork()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    _train(cfg_dict, stop_after)


# What the fork server imports once for every run: only modules that never ask CUDA anything. Importing megatron
# (any of megatron.core: its dist_checkpointing calls torch.cuda.is_available()) or torch's cpp_extension does, and
# in a CUDA build of torch that poisons fork — every child then fails at torch.cuda.set_device. Each run imports
# the trainer itself (a few seconds, the runs side by side); tests/benchmarks/test_determinism_fork.py checks it.
FORK_SERVER_PRELOAD = ["determinism_check", "torch", "mlmclm.data.prepare"]
_CONTEXT = None


def _context():
    """A fork server: a fresh interpreter that imports torch once and never touches CUDA; each run is forked
    from it — a new process, with no compiled kernel, CUDA context or generator state of any other run."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(FORK_SERVER_PRELOAD)
    return _CONTEXT


def launch(*runs: tuple[dict, int | None]) -> None:
    """Each (config, stop_after) run in its own new process, forked from the fork server, all at once (they are
    independent: each its own run directory, port and process; deterministic kernels give the same result whatever
    else shares the GPU), then waited for."""
    from mlmclm.parallel.ports import free_port

    processes = []
    try:
        for cfg_dict, stop_after in runs:
            processes.append((cfg_dict, _context().Process(target=_in_new_process, args=(cfg_dict, stop_after,
                                                                                        free_port()))))
            processes[-1][1].start()
        for cfg_dict, process in processes:
            process.join()
            if process.exitcode != 0:
                raise RuntimeError(f"the run in {cfg_dict['run_dir']} exited with {process.exitcode}")
    finally:  # a deadline (gpu_deadline.DeadlineReached) or a failed run: none of the others runs on
        for _, process in processes:
            if process.is_alive():
                process.kill()
                process.join()


def per_step(run_dir: Path) -> dict[int, tuple[float, float | None]]:
    """step → (loss, grad norm) from the run's metrics.jsonl (the last time each step was logged)."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        out[row["step"]] = (row[f"train/{row['phase']}/loss"], row.get("train/grad_norm"))
    return out


def compare(reference: dict, other: dict) -> dict:
    steps = sorted(reference)
    differing = [s for s in steps if other.get(s) != reference[s]]
    loss_diffs = [abs(other[s][0] - reference[s][0]) for s in steps if s in other]
    norm_diffs = [abs(other[s][1] - reference[s][1]) / max(abs(reference[s][1]), 1e-12) for s in steps
                  if s in other and other[s][1] is not None and reference[s][1] is not None]
    return {"steps": len(steps), "same_steps": sorted(other) == steps, "bit_identical": not differing,
            "first_differing_step": differing[0] if differing else None,
            "max_abs_loss_diff": max(loss_diffs, default=math.nan),
            "max_rel_grad_norm_diff": max(norm_diffs, default=math.nan),
            "per_step": {s: {"reference": reference[s], "other": other.get(s)} for s in steps}}


def determinism_check(cfg: DeterminismConfig, out: Path, on_progress=None) -> dict:
    """Runs the four launches under `out` and compares; `passed` means bit-identical in both comparisons.
    `on_progress(partial)` after the first three runs (the session writes it: a deadline may cut the resume)."""
    from mlmclm.data.prepare import prepare_embedded_corpus

    data = out / "data"
    prepare_embedded_corpus(data, seq_length=cfg.seq_length,
                            max_tokens=max(60_000, 2 * cfg.steps * cfg.global_batch * cfg.seq_length))
    dirs = {name: out / name for name in ("a", "b", "c")}
    seconds, statuses = {}, {}
    # A, B and C up to its stop side by side (one process each), then C's resume.
    for group in ((("a", dirs["a"], None), ("b", dirs["b"], None), ("c stop", dirs["c"], cfg.stop_after)),
                  (("c resume", dirs["c"], None),)):
        start = time.monotonic()
        launch(*((run_config(cfg, run_dir, data), stop) for _, run_dir, stop in group))
        for name, run_dir, _ in group:
            seconds[name] = round(time.monotonic() - start, 1)
            statuses[name] = json.loads((run_dir / "run_status.json").read_text())
        if on_progress is not None and "c resume" not in statuses:
            on_progress({"config": asdict(cfg), "seconds": dict(seconds),
                         "statuses": {n: (s["status"], s["step"]) for n, s in statuses.items()},
                         "same_seed": compare(per_step(dirs["a"]), per_step(dirs["b"]))})
    stopped = statuses["c stop"]["status"] == "preempted" and statuses["c stop"]["step"] == cfg.stop_after
    a, b, c = (per_step(dirs[n]) for n in ("a", "b", "c"))
    same_seed, resumed = compare(a, b), compare(a, c)
    return {"config": asdict(cfg), "seconds": seconds,
            "statuses": {name: (s["status"], s["step"]) for name, s in statuses.items()},
            "same_seed": same_seed, "stop_and_resume": resumed,
            "passed": same_seed["bit_identical"] and resumed["bit_identical"] and stopped
            and statuses["c resume"]["status"] == "completed"}
