"""Speed rows of the GPU session: tokens/s, MFU, peak memory and host synchronisations per step of what training
runs — `Trainer.step` (pretrain's `train_step`, its stop flag included) with the chunked head at its training
default and random-length samples laid end to end (packed THD segments with TE's fused RoPE on TE layers), in
bf16 and in FP8 (tensorwise, delayed); and FP8 attention where the gate allows it (padded rows, delayed scaling,
head_dim 128: eurobert-2.1b's heads, in a shallower model so that it builds and runs in seconds).

Every row is time-boxed (`seconds_per_run`), every row past the section's deadline is skipped saying so, and
`on_row` is called after each row so that the session writes what is measured the moment it is.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import asdict, dataclass, field

import torch

from gpu_trainer import (Trainer, free_memory, host_syncs, padded_inputs, peak_memory_gib, precision_for,
                         random_length_inputs, reset_peak_memory, synchronize)
from mlmclm.data.random_length import SampleLengths
from mlmclm.flops import flops_for_lengths, lm_head_fraction, mfu
from mlmclm.model import preset


@dataclass
class SpeedConfig:
    models: list[str] = field(default_factory=lambda: ["eurobert-210m", "eurobert-1b"])
    objectives: list[str] = field(default_factory=lambda: ["mlm", "clm"])
    samples: int = 12                # random-length samples per micro-batch (mean 1030 tokens: ~12.4k)
    min_length: int = 12
    max_length: int = 2048
    warmup_steps: int = 3            # not timed (torch.compile of the fused kernels happens here)
    min_steps: int = 3
    max_steps: int = 30
    seconds_per_run: float = 8.0
    sync_steps: int = 2              # steps counted with CUDA's sync debug mode, after the timed ones
    fp8_recipes: list[str] = field(default_factory=lambda: ["tensorwise", "delayed"])
    fp8_models: list[str] = field(default_factory=lambda: ["eurobert-210m"])
    # FP8 attention: TE trains it on Hopper only at head_dim 128 with delayed scaling on padded rows.
    attention_model: str = "eurobert-2.1b"
    attention_layers: int = 8
    attention_rows: int = 4
    attention_seq: int = 2048
    seed: int = 1234

    @classmethod
    def smoke(cls) -> "SpeedConfig":
        return cls(models=["tiny-test"], samples=3, min_length=4, max_length=32, warmup_steps=1, min_steps=2,
                   max_steps=3, seconds_per_run=2.0, fp8_models=["tiny-test"], attention_model="tiny-test",
                   attention_layers=2, attention_rows=2, attention_seq=32)


@dataclass
class SpeedRow:
    model: str
    precision: str                   # bf16, or the FP8 recipe (FP8 GEMMs, bf16 elsewhere)
    objective: str
    layout: str                      # "random-length (THD on TE)" or "padded rows"
    micro_batch: str
    head_chunk_tokens: int
    status: str = "pending"          # ok | failed | skipped
    reason: str = ""
    fp8_attention: bool | None = None
    timed_steps: int = 0
    seconds: float = 0.0
    tokens_per_s: float | None = None     # real tokens (padding excluded)
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    peak_memory_gib: float | None = None
    host_syncs_per_step: list | None = None
    first_loss: float | None = None
    last_loss: float | None = None


def _time(trainer: Trainer, row: SpeedRow, inputs, cfg: SpeedConfig, peak: float | None) -> None:
    trainer.use(row.objective)
    reset_peak_memory()
    losses = [trainer.step(inputs[i % len(inputs)]).loss for i in range(cfg.warmup_steps)]
    synchronize()
    start, steps, tokens, flops = time.perf_counter(), 0, 0, 0.0
    fraction = lm_head_fraction(trainer.objective_configs[row.objective])
    while steps < cfg.max_steps and (steps < cfg.min_steps or time.perf_counter() - start < cfg.seconds_per_run):
        item = inputs[steps % len(inputs)]
        losses.append(trainer.step(item).loss)  # train_step's one read synchronises each step
        tokens += sum(item.lengths)
        flops += flops_for_lengths(trainer.model_cfg, item.lengths, causal=row.objective == "clm",
                                   lm_head_fraction=fraction if trainer.sparse_head else 1.0)
        steps += 1
    synchronize()
    row.seconds, row.timed_steps = time.perf_counter() - start, steps
    row.tokens_per_s = tokens / row.seconds
    row.tflops_per_gpu = flops / row.seconds / 1e12
    row.mfu = None if peak is None else mfu(row.tokens_per_s, flops / tokens, peak)
    row.peak_memory_gib = peak_memory_gib()[0]
    row.host_syncs_per_step = host_syncs(lambda i: trainer.step(inputs[i % len(inputs)]), cfg.sync_steps)
    row.first_loss, row.last_loss = losses[0], losses[-1]
    row.status = "ok"


def _inputs(trainer: Trainer, objective: str, cfg: SpeedConfig, padded: bool):
    vocab = trainer.model_cfg.vocab_size
    if padded:
        return padded_inputs(trainer.objectives[objective], vocab, cfg.attention_rows, cfg.attention_seq, 2,
                             cfg.seed)
    return random_length_inputs(trainer.objectives[objective], vocab, cfg.samples,
                                SampleLengths(cfg.min_length, cfg.max_length), 3, cfg.seed)


def run_rows(cfg: SpeedConfig, plan: list[tuple[str, str, dict]], peak: float | None, deadline: float,
             on_row) -> list[SpeedRow]:
    """`plan`: (model, precision, trainer options) — one Trainer each, every objective of `cfg` on it. A model
    that cannot build fails its rows; an out-of-memory row is retried with half the micro-batch."""
    rows: list[SpeedRow] = []
    for model, precision, options in plan:
        padded = not options.get("packed_segments", True)
        shape = options.get("shape", {})
        micro = (f"{cfg.attention_rows} x {cfg.attention_seq}" if padded
                 else f"{cfg.samples} samples of {cfg.min_length}-{cfg.max_length}")
        planned = [SpeedRow(model + ("" if not shape else f" ({shape})"), precision, objective,
                            "padded rows" if padded else "random-length (THD on TE)", micro,
                            options.get("head_chunk_tokens", 256)) for objective in options.get(
                                "objectives", cfg.objectives)]
        rows += planned
        trainer = None
        try:
            if time.monotonic() + cfg.seconds_per_run * (1 + len(planned)) > deadline:  # build, warm-up, rows
                raise TimeoutError("the section's time budget was spent before this model")
            kwargs = {k: v for k, v in options.items() if k not in ("shape", "objectives", "fp8_attention")}
            trainer = Trainer(model, precision_for(precision, options.get("fp8_attention", "auto")), cfg.seed,
                              **kwargs, **shape)
            for row in planned:
                row.fp8_attention = trainer.fp8_attention
                if time.monotonic() + cfg.seconds_per_run > deadline:
                    row.status, row.reason = "skipped", "the section's time budget was spent"
                    continue
                _with_oom_retry(trainer, row, cfg, padded, peak)
                on_row(rows)
        except Exception as err:  # the model did not build, or the budget ran out: each pending row says why
            for row in planned:
                if row.status == "pending":
                    row.status = "skipped" if isinstance(err, TimeoutError) else "failed"
                    row.reason = f"{type(err).__name__}: {str(err)[:300]}"
            if not isinstance(err, TimeoutError):
                traceback.print_exc()
        finally:
            if trainer is not None:
                trainer.close()
            free_memory()
        on_row(rows)
    return rows


def _with_oom_retry(trainer: Trainer, row: SpeedRow, cfg: SpeedConfig, padded: bool, peak) -> None:
    while True:
        try:
            _time(trainer, row, _inputs(trainer, row.objective, cfg, padded), cfg, peak)
            return
        except (torch.OutOfMemoryError, RuntimeError) as err:
            # Some kernels (cuBLAS, TE) report allocation failures as a plain RuntimeError.
            if not isinstance(err, torch.OutOfMemoryError) and "out of memory" not in str(err).lower():
                row.status, row.reason = "failed", f"{type(err).__name__}: {str(err)[:300]}"
                traceback.print_exc()
                return
            free_memory()
            if cfg.samples == 1 or padded:
                row.status, row.reason = "failed", f"out of memory: {str(err)[:200]}"
                return
            cfg = SpeedConfig(**{**asdict(cfg), "samples": cfg.samples // 2})
            row.micro_batch = f"{cfg.samples} samples of {cfg.min_length}-{cfg.max_length} (halved: out of memory)"


def bf16_plan(cfg: SpeedConfig) -> list:
    return [(model, "bf16", {}) for model in cfg.models]


def fp8_plan(cfg: SpeedConfig) -> list:
    """FP8 GEMMs on the training default, per recipe; then FP8 attention where TE trains it (padded rows,
    delayed, head_dim 128), next to the same shape with FP8 attention off."""
    plan = [(model, recipe, {}) for recipe in cfg.fp8_recipes for model in cfg.fp8_models]
    base = preset(cfg.attention_model)
    shape = {"num_layers": min(cfg.attention_layers, base.num_layers)}
    for fp8_attention in ("auto", "off"):
        plan.append((cfg.attention_model, "delayed", {"packed_segments": False, "shape": shape,
                                                      "objectives": ["mlm"], "fp8_attention": fp8_attention}))
    return plan


def ratios(rows: list[SpeedRow], baseline: list[dict]) -> list[dict]:
    """FP8 tokens/s over bf16 tokens/s, same model, objective and layout (bf16 rows: the speed_bf16 section's)."""
    base = {(r["model"], r["objective"], r["layout"]): r for r in baseline if r["status"] == "ok"}
    out = []
    for row in rows:
        ref = base.get((row.model, row.objective, row.layout))
        if row.status == "ok" and ref is not None:
            out.append({"model": row.model, "precision": row.precision, "objective": row.objective,
                        "fp8_over_bf16": row.tokens_per_s / ref["tokens_per_s"]})
    return out
