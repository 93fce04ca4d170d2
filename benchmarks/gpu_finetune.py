"""The GPU session's fine-tuning comparison (the first part of section `features`, issue 53): our evaluation loop
(`mlmclm.eval.finetune.training.train`, what every `tools/evaluate.py` unit runs) against transformers' `Trainer`
as EncodEval runs it, on one GPU, steps/s side by side (benchmarks/finetune_step.py's two sides: the same random
EuroBERT under EncodEval's sequence-classification head, the model cast to bf16 and the forward under bf16
autocast, 32 rows a step in 8 micro-batches of 4, torch's non-fused AdamW, warmup + linear decay, clip 1.0);
rounds interleaved, the side that goes first alternating, each a whole run (set-up included: a grid is thousands
of short runs). Then our loop's host synchronisations over a whole run (CUDA's sync debug mode: the one expected is
the losses' read after the last step), and the runs per hour for the model at EncodEval's budgets (1000 steps:
SC, QA, IR) from our steps/s.

The Trainer needs `accelerate` (the `bench` extra): without it that side is "not reached: accelerate absent".
Without CUDA (the session's CPU dry run) every shape is the smoke one. Stops at `deadline` between pieces."""
from __future__ import annotations

import argparse
import copy
import importlib.util
import shutil
import statistics
import tempfile
import time
import traceback
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

ENCODEVAL_STEPS = 1000  # configs/{SC,QA,IR}/*.yaml max_steps: one run of the paper suite's SC/QA/IR tasks


@dataclass
class FinetuneBenchConfig:
    model: str = "eurobert-610m"  # a shape of mlmclm.model.config.PRESETS
    seq: int = 128  # tokens per row (no padding: every row this long)
    steps: int = 8  # optimizer steps per run and side
    rounds: int = 2
    rows: int = 256
    sync_steps: int = 4  # the run whose host synchronisations are counted
    device: str = "cuda"

    @classmethod
    def smoke(cls) -> FinetuneBenchConfig:
        return cls(model="tiny-test", seq=16, steps=2, rounds=1, rows=64, sync_steps=2, device="cpu")


def _arguments(cfg: FinetuneBenchConfig) -> argparse.Namespace:
    """benchmarks/finetune_step.py's arguments for a paper shape."""
    from mlmclm.model.config import PRESETS

    shape = PRESETS[cfg.model]
    return argparse.Namespace(hidden=shape.hidden_size, layers=shape.num_layers, heads=shape.num_attention_heads,
                              kv_heads=shape.num_kv_heads, ffn=shape.ffn_hidden_size, vocab=shape.vocab_size,
                              seq=cfg.seq, batch=32, micro=4, rows=cfg.rows, steps=cfg.steps, dtype="bfloat16",
                              head="encodeval", device=cfg.device)


def _host_syncs(model, rows, args) -> int:
    """Host synchronisations in one whole run of our loop, as CUDA's sync debug mode warns of them."""
    import torch

    from finetune_step import ours

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            ours(model, rows, args)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def finetune_comparison(cfg: FinetuneBenchConfig, deadline: float, write=lambda result: None) -> dict:
    """Ours vs the Trainer (see the module); `write(result)` after each piece. Raises nothing: an error is in the
    result's "error", a deadline in its "not_reached"."""
    import torch
    from finetune_step import build, ours, trainer

    args = _arguments(cfg)
    trainer_absent = importlib.util.find_spec("accelerate") is None
    result = {"config": asdict(cfg), "mode": cfg.device, "seconds": {"ours": [], "Trainer": []},
              "trainer": "not reached: accelerate absent (pip install -e '.[bench]')" if trainer_absent else "ran"}
    folder = Path(tempfile.mkdtemp(prefix="gpu_finetune_"))

    def in_time(what: str) -> None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the deadline came before {what}")

    try:
        in_time("the model was built")
        initial, rows = build(args, folder)
        initial = initial.to(device=cfg.device, dtype=torch.bfloat16)  # both sides cast it so; copies stay on the GPU
        sides = ["ours"] + ([] if trainer_absent else ["Trainer"])
        for round_ in range(cfg.rounds):
            for side in (sides if round_ % 2 == 0 else sides[::-1]):
                in_time(f"round {round_ + 1} of {side}")
                model = copy.deepcopy(initial)
                seconds = ours(model, rows, args) if side == "ours" else trainer(model, rows, args, str(folder))
                result["seconds"][side].append(round(seconds, 3))
                del model
                write(result)
        best = {side: cfg.steps / min(times) for side, times in result["seconds"].items() if times}
        result["steps_per_s"] = best
        result["steps_per_s_median"] = {side: cfg.steps / statistics.median(times)
                                        for side, times in result["seconds"].items() if times}
        if "Trainer" in best:
            result["ours_over_trainer"] = best["ours"] / best["Trainer"]
        result["runs_per_hour"] = {"steps_per_run": ENCODEVAL_STEPS, "ours": 3600 * best["ours"] / ENCODEVAL_STEPS,
                                   "note": f"training only ({cfg.seq}-token rows, unpadded), one GPU"}
        write(result)
        if cfg.device == "cuda":
            in_time("the host synchronisations were counted")
            sync_args = argparse.Namespace(**{**vars(args), "steps": cfg.sync_steps})
            result["host_syncs_per_run"] = {"steps": cfg.sync_steps,
                                            "syncs": _host_syncs(copy.deepcopy(initial), rows, sync_args),
                                            "expected": "1: the losses read after the last step"}
        else:
            result["host_syncs_per_run"] = "not measured: no CUDA (tests/eval/test_finetune_device.py checks on meta)"
    except TimeoutError as err:
        result["not_reached"] = str(err)
    except Exception as err:
        result["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        traceback.print_exc()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return result
