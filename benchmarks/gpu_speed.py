"""Speed rows of the GPU session: tokens/s, MFU, peak memory and host synchronisations per step of what training
runs — `Trainer.step` (pretrain's `train_step`, its stop flag included) with the chunked head at its training
default and random-length samples laid end to end (packed THD segments with TE's fused RoPE on TE layers), in
bf16 and in FP8 (tensorwise, delayed); and FP8 attention where the gate allows it (padded rows, delayed scaling,
head_dim 128: eurobert-2.1b's heads, in a shallower model so that it builds and runs in seconds). Each step's
batches come through pretrain's own batch path (gpu_trainer.PretrainBatches: loaders, prefetch thread, pinned
copies), so the batch work a training step pays is timed with it.

A row names what actually ran, read from the model and the head after the fact, never what was planned: the
attention (`attention`: "TE THD", "TE padded" or "local" — a TE build that fell back to local layers says
"local") and the chunked head's weight-gradient GEMM (`wgrad`, mlmclm.model.wgrad_gemm.last_path). Local layers on
rows too long for their mask are refused as pretrain refuses them (status "refused", with the reason).

Every row is time-boxed (`seconds_per_run`), every row past the section's deadline is skipped saying so, and
`on_row` is called after each row so that the session writes what is measured the moment it is.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import asdict, dataclass, field

import torch

from gpu_trainer import (PretrainBatches, Trainer, free_memory, host_syncs, peak_memory_gib, precision_for,
                         reset_peak_memory, synchronize)
from mlmclm.data.random_length import SampleLengths
from mlmclm.flops import flops_for_lengths, lm_head_fraction, mfu
from mlmclm.model import preset, wgrad_gemm
from mlmclm.model.head_chunks import DEFAULT_CHUNK_TOKENS


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


BATCH_PATH = "pretrain: PhaseLoaders + StepBatches prefetch + HostStep.to (pinned copies)"


@dataclass
class SpeedRow:
    model: str
    precision: str                   # bf16, or the FP8 recipe (FP8 GEMMs, bf16 elsewhere)
    objective: str
    layout: str                      # the batches: "random-length samples" or "padded rows"
    micro_batch: str
    head_chunk_tokens: int
    status: str = "pending"          # ok | failed | skipped | refused (the library refused the configuration)
    attention: str | None = None     # what the model built runs: "TE THD", "TE padded" or "local"
    wgrad: str | None = None         # the chunked head's weight-gradient GEMM that ran (mlmclm.model.wgrad_gemm)
    batch_path: str = BATCH_PATH
    built_ahead: int | None = None   # steps whose batch the prefetch thread had built
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


def _time(trainer: Trainer, row: SpeedRow, source: PretrainBatches, cfg: SpeedConfig, peak: float | None) -> None:
    trainer.use(row.objective)
    reset_peak_memory()
    wgrad_gemm.last_path = None
    losses = [trainer.step(source.next()).loss for _ in range(cfg.warmup_steps)]
    synchronize()
    start, steps, tokens, flops = time.perf_counter(), 0, 0, 0.0
    fraction = lm_head_fraction(trainer.objective_configs[row.objective])
    while steps < cfg.max_steps and (steps < cfg.min_steps or time.perf_counter() - start < cfg.seconds_per_run):
        item = source.next()  # the batch the thread built during the last step, copied as pretrain copies it
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
    row.host_syncs_per_step = host_syncs(lambda i: trainer.step(source.next()), cfg.sync_steps)
    row.first_loss, row.last_loss = losses[0], losses[-1]
    row.wgrad, row.built_ahead = wgrad_gemm.last_path, source.built_ahead
    row.status = "ok"


def _steps_needed(cfg: SpeedConfig) -> int:
    return cfg.warmup_steps + cfg.max_steps + cfg.sync_steps


def _source(trainer: Trainer, row: SpeedRow, cfg: SpeedConfig, padded: bool, work, precision) -> PretrainBatches:
    if padded:
        return PretrainBatches(trainer, row.objective, cfg.attention_rows, None, _steps_needed(cfg), cfg.seed, work,
                               precision, row_length=cfg.attention_seq)
    return PretrainBatches(trainer, row.objective, cfg.samples, SampleLengths(cfg.min_length, cfg.max_length),
                           _steps_needed(cfg), cfg.seed, work, precision)


def run_rows(cfg: SpeedConfig, plan: list[tuple[str, str, dict]], peak: float | None, deadline: float,
             on_row, work) -> list[SpeedRow]:
    """`plan`: (model, precision, trainer options) — one Trainer each, every objective of `cfg` on it. A model
    that cannot build fails its rows (a configuration the library refuses: "refused"); an out-of-memory row is
    retried with half the micro-batch. `work`: where the rows' datasets go."""
    rows: list[SpeedRow] = []
    for model, precision, options in plan:
        padded = not options.get("packed_segments", True)
        shape = options.get("shape", {})
        micro = (f"{cfg.attention_rows} x {cfg.attention_seq}" if padded
                 else f"{cfg.samples} samples of {cfg.min_length}-{cfg.max_length}")
        planned = [SpeedRow(model + ("" if not shape else f" ({shape})"), precision, objective,
                            "padded rows" if padded else "random-length samples", micro,
                            options.get("head_chunk_tokens", DEFAULT_CHUNK_TOKENS)) for objective in options.get(
                                "objectives", cfg.objectives)]
        rows += planned
        trainer = None
        try:
            if time.monotonic() + cfg.seconds_per_run * (1 + len(planned)) > deadline:  # build, warm-up, rows
                raise TimeoutError("the section's time budget was spent before this model")
            kwargs = {k: v for k, v in options.items() if k not in ("shape", "objectives", "fp8_attention")}
            row_tokens = cfg.attention_seq if padded else cfg.samples * cfg.max_length
            trainer = Trainer(model, precision_for(precision, options.get("fp8_attention", "auto")), cfg.seed,
                              max_row_tokens=row_tokens, rows=cfg.attention_rows if padded else 1, **kwargs, **shape)
            for row in planned:
                row.fp8_attention, row.attention = trainer.fp8_attention, trainer.attention
                if time.monotonic() + cfg.seconds_per_run > deadline:
                    row.status, row.reason = "skipped", "the section's time budget was spent"
                    continue
                _with_oom_retry(trainer, row, cfg, padded, peak, work,
                                precision_for(precision, options.get("fp8_attention", "auto")))
                on_row(rows)
        except Exception as err:  # the model did not build, or the budget ran out: each pending row says why
            status = "skipped" if isinstance(err, TimeoutError) else "refused" if isinstance(err, ValueError) \
                else "failed"
            for row in planned:
                if row.status == "pending":
                    row.status, row.reason = status, f"{type(err).__name__}: {str(err)[:300]}"
            if status == "failed":
                traceback.print_exc()
        finally:
            if trainer is not None:
                trainer.close()
            free_memory()
        on_row(rows)
    return rows


def _with_oom_retry(trainer: Trainer, row: SpeedRow, cfg: SpeedConfig, padded: bool, peak, work, precision) -> None:
    while True:
        source = None
        try:
            source = _source(trainer, row, cfg, padded, work, precision)
            _time(trainer, row, source, cfg, peak)
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
        finally:
            if source is not None:
                source.close()


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
    base = {(r["model"], r["objective"], r["layout"], r.get("attention")): r for r in baseline if r["status"] == "ok"}
    out = []
    for row in rows:
        ref = base.get((row.model, row.objective, row.layout, row.attention))
        if row.status == "ok" and ref is not None:
            out.append({"model": row.model, "precision": row.precision, "objective": row.objective,
                        "fp8_over_bf16": row.tokens_per_s / ref["tokens_per_s"]})
    return out
