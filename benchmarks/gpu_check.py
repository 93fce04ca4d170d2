#!/usr/bin/env python
"""GPU readiness check: versions, bf16 (and FP8) training throughput/MFU/memory, each speed feature on vs off
(sparse MLM head vs full head, fused kernels, manual GC), host synchronisations per step, bf16-vs-fp32 loss
agreement, then whether `deterministic: true` makes runs bit-reproducible (determinism_check.py: two same-seed runs
and a stopped-and-resumed one through `pretrain`, compared step by step) — the speed table first, so that a short
device session measures it before anything else.

    python benchmarks/gpu_check.py --json artifacts/gpu_check.json            # one GPU, < 8 minutes
    python benchmarks/gpu_check.py --smoke --json /tmp/gpu_check.json         # CPU, tiny shape (what CI runs)

Single process (`init_parallel(ParallelConfig())`). Data are uniformly random tokens: throughput does not depend
on token values, and losses stay near ln(vocab). Each model is built once per precision and trained through our
real `train_step` (megatron schedules, DDP, distributed AdamW) at every sequence length and objective; warm-up
steps are excluded from timing and every configuration is time-boxed. MFU uses model FLOPs from `mlmclm.flops`:
the FLOPs each step needs (MLM with the sparse head: the LM head at the masked positions only; CLM and the full
head: at every position; causal attention counted at half). The feature table compares, at one shape, the
defaults with each feature switched off in turn, in interleaved rounds (tokens/s is the median of the rounds). Prints one table at the end, writes it as JSON,
and exits non-zero on any failure (an exception, a non-finite or skipped step, losses that disagree, a
configuration the time budget could not reach; with --require-goals, also a missed performance goal).
"""
from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import logging
import math
import resource
import sys
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Library chatter (deprecations, "TE/apex not installed", the emulation's non-leaf .grad probe) would bury the table.
warnings.filterwarnings("ignore", category=UserWarning, module="megatron.*")
warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed.*")
warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex|non-leaf Tensor).*")
logging.getLogger("megatron").setLevel(logging.ERROR)

import torch  # noqa: E402

from mlmclm.flops import flops_per_token, lm_head_fraction, mfu, peak_flops  # noqa: E402
from mlmclm.model import PRESETS, PrecisionConfig, build_model, preset, set_causal  # noqa: E402
from mlmclm.model.build import resolve_use_te  # noqa: E402
from mlmclm.model.chunked_head import DEFAULT_CHUNK_TOKENS  # noqa: E402
from mlmclm.model.sparse_head import flat_positions  # noqa: E402
from mlmclm.model.fusions import fusion_flags  # noqa: E402
from mlmclm.model.precision import fp8_attention_here, transformer_engine_available  # noqa: E402
from mlmclm.objectives import ObjectiveConfig, build_objective  # noqa: E402
from mlmclm.parallel import ParallelConfig, current_device, destroy_parallel, init_parallel  # noqa: E402
from mlmclm.train.optim import OptimizerConfig, ScheduleConfig, build_optimizer, build_scheduler, wrap_ddp  # noqa
from mlmclm.train.signals import StopRequest  # noqa: E402
from mlmclm.train.step import ManualGC, configure_model_for_schedules, train_step  # noqa: E402
from determinism_check import DeterminismConfig, determinism_check  # noqa: E402

SPECIAL_IDS = [0, 1, 2, 3]  # pad, bos, eos, mask: never drawn as data, never masked
MASK_ID = 3
# Tokens per micro-batch chosen to fit an 80 GB H100 with our loss (fp32 logits over 128k vocab at every position
# dominate): ~45 GB for 210m and ~55 GB for 1b with TE attention. On out-of-memory the micro-batch is halved.
TOKENS_PER_MICRO_BATCH = {"eurobert-210m": 16384, "eurobert-1b": 8192}
GOAL_BF16_MFU = 0.45    # 1b, sequence 2048, one H100/H200
GOAL_FP8_SPEEDUP = 1.3  # FP8 tokens/s over bf16 tokens/s, same configuration
FP8_RECIPE = "tensorwise"  # PrecisionConfig's default (current scaling); FP8 attention stays bf16 on Hopper
# Speed features compared on vs off (one GPU, so nothing that needs data parallelism: overlapped gradient
# reduction and the NCCL environment are not measurable here). name -> Trainer keyword arguments of the "off" side.
FEATURES = {
    "sparse MLM head": {"sparse_head": False},
    "fused kernels": {"fused_kernels": False},
    "manual GC (interval 100)": {"manual_gc_interval": 0},
}


@dataclass
class CheckConfig:
    smoke: bool = False
    models: list[str] = field(default_factory=lambda: ["eurobert-210m", "eurobert-1b"])
    seq_lengths: list[int] = field(default_factory=lambda: [1024, 2048])
    objectives: list[str] = field(default_factory=lambda: ["mlm", "clm"])
    warmup_steps: int = 5
    max_steps: int = 50           # timed steps per configuration, at most
    min_steps: int = 3            # timed steps per configuration, at least (even past the time box)
    seconds_per_run: float = 15.0  # time box of the timed steps of one configuration
    budget_s: float = 450.0       # whole script; configurations that cannot start in time are failures
    agreement_model: str = "eurobert-210m"
    agreement_seq: int = 1024
    agreement_micro_batch: int = 4
    agreement_steps: int = 8
    agreement_rtol: float = 0.01  # |bf16 - fp32| / fp32 per step
    peak_tflops: float | None = None  # bf16 peak override of the table (also gives CPU an MFU in smoke mode)
    peak_tflops_fp8: float | None = None  # fp8 peak override; defaults to 2x peak_tflops when that is given
    require_goals: bool = False
    seed: int = 1234
    features: bool = True          # the on-vs-off feature table
    feature_model: str = "eurobert-210m"
    feature_seq: int = 2048
    feature_rounds: int = 3        # interleaved rounds: every variant once per round
    feature_steps: int = 8         # timed steps per variant and round
    determinism: bool = True       # two same-seed runs and a stop/resume, deterministic: true (after the rest)
    # Peak memory at the paper's worst-case micro-batch (12 samples of 2048 tokens: 24,576), CLM (the full head),
    # measured next to mlmclm/model/memory.py's estimate for this one GPU (data parallel 1).
    worst_case_model: str = "eurobert-610m"
    worst_case_samples: int = 12
    worst_case_length: int = 2048

    @classmethod
    def smoke_defaults(cls, **overrides) -> "CheckConfig":
        base = dict(smoke=True, models=["tiny-test"], seq_lengths=[64, 128], warmup_steps=1, max_steps=3,
                    min_steps=2, seconds_per_run=5.0, budget_s=300.0, agreement_model="tiny-test",
                    agreement_seq=64, agreement_micro_batch=2, agreement_steps=3, feature_model="tiny-test",
                    feature_seq=64, feature_rounds=2, feature_steps=2, worst_case_model="tiny-test",
                    worst_case_samples=3, worst_case_length=32)
        base.update(overrides)
        return cls(**base)


@dataclass
class RunRow:
    model: str
    precision: str  # "bf16" or "fp8" (FP8 GEMMs; attention per `fp8_attention`)
    objective: str
    seq_length: int
    micro_batch: int = 0
    status: str = "pending"  # ok | failed | skipped
    reason: str = ""
    fp8_attention: bool | None = None
    fp8_attention_reason: str = ""
    warmup_steps: int = 0
    timed_steps: int = 0
    seconds: float = 0.0
    tokens_per_s: float | None = None
    flops_per_token: float | None = None
    tflops_per_gpu: float | None = None
    peak_tflops: float | None = None
    mfu: float | None = None
    peak_memory_gib: float | None = None
    first_loss: float | None = None
    last_loss: float | None = None


# ---- device queries (benchmarks may touch torch.cuda; the library may not) -------------------------------------

def on_gpu() -> bool:
    return torch.cuda.is_available()


def synchronize() -> None:
    if on_gpu():
        torch.cuda.synchronize()


def reset_peak_memory() -> None:
    if on_gpu():
        torch.cuda.reset_peak_memory_stats()


def peak_memory_gib() -> tuple[float, str]:
    """CUDA: the high-water mark of allocated tensors since the last reset. CPU: the process's max RSS."""
    if on_gpu():
        return torch.cuda.max_memory_allocated() / 2**30, "cuda_max_memory_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "cpu_process_max_rss"


def free_memory() -> None:
    gc.collect()
    if on_gpu():
        torch.cuda.empty_cache()


def device_description() -> dict:
    if not on_gpu():
        return {"name": "cpu", "compute_capability": None, "memory_gib": None}
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"name": torch.cuda.get_device_name(), "compute_capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1)}


def fp8_support() -> tuple[bool, str]:
    """Whether FP8 GEMMs can run here: TE importable, and TE (or the compute capability) says the GPU can."""
    ok, why = transformer_engine_available()
    if not ok:
        return False, f"FP8 off: {why}"
    for module in ("transformer_engine.pytorch.fp8", "transformer_engine.pytorch.quantization"):
        try:
            check = getattr(__import__(module, fromlist=["check_fp8_support"]), "check_fp8_support")
        except (ImportError, AttributeError):
            continue
        supported, reason = check()
        return bool(supported), "FP8 on" if supported else f"FP8 off: {reason}"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        return False, f"FP8 off: needs compute capability >= 8.9, this GPU is {major}.{minor}"
    return True, "FP8 on"


def _version(*dists: str) -> str | None:
    for name in dists:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def cudnn_version() -> int | str | None:
    """torch's cuDNN, or why it cannot be read: on an H200 image TE had loaded a system cuDNN (9.14) before
    torch's own (9.19), and torch's version check then raised in every later cuDNN call of the process."""
    if not on_gpu():
        return None
    try:
        return torch.backends.cudnn.version()
    except RuntimeError as err:
        return f"unusable: {err}"


def environment() -> dict:
    use_te = resolve_use_te(None)
    te_ok, te_why = transformer_engine_available()
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": cudnn_version(),
        "transformer_engine": _version("transformer_engine", "transformer-engine", "transformer_engine_torch"),
        "apex": _version("apex"),
        "megatron_core": _version("megatron-core", "megatron_core"),
        "device": device_description(),
        "layer_spec": "transformer_engine" if use_te else "local",
        "layer_spec_reason": te_why if te_ok else f"megatron local layers: {te_why}",
        "fused_kernels": fusion_flags(use_te).summary(use_te),
    }


# ---- training runs ---------------------------------------------------------------------------------------------

class Trainer:
    """One model, its DDP wrapper, optimizer and scheduler; switches objective and sequence length freely."""

    def __init__(self, model_name: str, precision: PrecisionConfig, seed: int, init_from: "Trainer | None" = None,
                 sparse_head: bool = True, fused_kernels: bool = True, manual_gc_interval: int = 100,
                 packed_segments: bool = False):
        self.model_cfg = preset(model_name)
        self.sparse_head = sparse_head
        self.manual_gc = ManualGC(manual_gc_interval)
        self.steps_done = 0
        torch.manual_seed(seed)
        self.chunks = build_model(self.model_cfg, ParallelConfig(), precision, causal=False,
                                  fused_kernels=fused_kernels, packed_segments=packed_segments)
        if init_from is not None:
            copy_weights(init_from.chunks, self.chunks)
        self.ddp = wrap_ddp(self.chunks, distributed_optimizer=True)
        opt_cfg = OptimizerConfig(lr=1e-4)  # small and constant: the check measures speed, not learning
        self.optimizer = build_optimizer(self.ddp, opt_cfg)
        self.scheduler = build_scheduler(self.optimizer, opt_cfg, ScheduleConfig(style="constant"), total_steps=10**6)
        configure_model_for_schedules(self.ddp, self.optimizer)
        self.objective_configs = {kind: ObjectiveConfig(kind) for kind in ("mlm", "clm")}
        # pretrain's step reads an agreed stop flag with its other numbers; no signal handler here (the session
        # script's timeout must still be able to stop this process).
        self.stop = StopRequest(signals=())
        self.objectives = {kind: build_objective(self.objective_configs[kind], special_token_ids=SPECIAL_IDS,
                                                 mask_token_id=MASK_ID, vocab_size=self.model_cfg.vocab_size,
                                                 seed=seed) for kind in ("mlm", "clm")}

    def batches(self, objective: str, seq: int, micro_batch: int, count: int, seed: int):
        """`count` distinct random micro-batches, each with the sparse head's positions, made on the host as
        pretrain makes them (no device read for the positions) and moved to the device before any timing."""
        gen = torch.Generator().manual_seed(seed)
        out = []
        for i in range(count):
            tokens = torch.randint(len(SPECIAL_IDS), self.model_cfg.vocab_size, (micro_batch, seq), generator=gen)
            ids = torch.arange(i * micro_batch, (i + 1) * micro_batch)
            batch = self.objectives[objective].prepare(tokens, ids)
            positions = None if batch.causal else flat_positions([batch.loss_mask])
            out.append((batch.to(current_device()),
                        None if positions is None else [p.to(current_device()) for p in positions]))
        return out

    def step(self, batch_and_positions, documents=None, head_chunk_tokens: int = 0):
        # Each step under this trainer's own GC regime (as its pretrain would run): the feature table alternates
        # trainers in one process and the collector is process-wide, so each sets it for its own steps.
        if self.manual_gc.interval:
            gc.disable()
        else:
            gc.enable()
        batch, positions = batch_and_positions
        result = train_step(self.ddp, self.optimizer, self.scheduler, [batch], sparse_head=self.sparse_head,
                            predicted_positions=positions, stop_flag=self.stop.agreed_flag, documents=documents,
                            head_chunk_tokens=head_chunk_tokens)
        self.steps_done += 1
        self.manual_gc.step(self.steps_done)
        if result.skipped or not math.isfinite(result.loss):
            raise RuntimeError(f"training step skipped or non-finite (loss {result.loss}, grad norm "
                               f"{result.grad_norm})")
        return result

    def close(self) -> None:
        gc.enable()
        del self.optimizer, self.scheduler, self.ddp, self.chunks
        free_memory()


@torch.no_grad()
def copy_weights(src_chunks, dst_chunks) -> None:
    dst = dict(p for c in dst_chunks for p in c.named_parameters())
    for c in src_chunks:
        for name, param in c.named_parameters():
            dst[name].copy_(param.to(dst[name].dtype))


def time_run(trainer: Trainer, row: RunRow, cfg: CheckConfig, peak: float | None) -> None:
    set_causal(trainer.chunks, row.objective == "clm")
    batches = trainer.batches(row.objective, row.seq_length, row.micro_batch, count=4, seed=cfg.seed)
    reset_peak_memory()
    losses = [trainer.step(batches[i % len(batches)]).loss for i in range(cfg.warmup_steps)]
    synchronize()
    start = time.perf_counter()
    steps = 0
    while steps < cfg.max_steps and (steps < cfg.min_steps or time.perf_counter() - start < cfg.seconds_per_run):
        losses.append(trainer.step(batches[steps % len(batches)]).loss)  # train_step's one read syncs each step
        steps += 1
    synchronize()
    row.seconds = time.perf_counter() - start
    row.warmup_steps, row.timed_steps = cfg.warmup_steps, steps
    row.tokens_per_s = steps * row.micro_batch * row.seq_length / row.seconds
    row.flops_per_token = step_flops_per_token(trainer, row.objective, row.seq_length)
    row.tflops_per_gpu = row.tokens_per_s * row.flops_per_token / 1e12
    row.peak_tflops = None if peak is None else peak / 1e12
    row.mfu = None if peak is None else mfu(row.tokens_per_s, row.flops_per_token, peak)
    row.peak_memory_gib = peak_memory_gib()[0]
    row.first_loss, row.last_loss = losses[0], losses[-1]
    row.status = "ok"


def step_flops_per_token(trainer: Trainer, objective: str, seq: int) -> float:
    """Model FLOPs per token that this step needs: the sparse head computes the LM head at the masked positions."""
    fraction = 1.0
    if objective == "mlm" and trainer.sparse_head:
        fraction = lm_head_fraction(trainer.objective_configs["mlm"])
    return flops_per_token(trainer.model_cfg, seq, causal=objective == "clm", lm_head_fraction=fraction)


def run_with_oom_fallback(trainer: Trainer, row: RunRow, cfg: CheckConfig, peak: float | None) -> None:
    while True:
        try:
            time_run(trainer, row, cfg, peak)
            return
        except (torch.OutOfMemoryError, RuntimeError) as err:
            # Some kernels (cuBLAS, TE) report allocation failures as a plain RuntimeError.
            if not isinstance(err, torch.OutOfMemoryError) and "out of memory" not in str(err).lower():
                raise
            free_memory()
            if row.micro_batch == 1:
                raise
            row.reason = f"out of memory at micro-batch {row.micro_batch}; halved"
            row.micro_batch //= 2


def micro_batch_for(model: str, seq: int, smoke: bool) -> int:
    return 2 if smoke else max(1, TOKENS_PER_MICRO_BATCH.get(model, 8192) // seq)


def precision_for(name: str) -> PrecisionConfig:
    if name == "fp8":
        return PrecisionConfig(dtype="bf16", fp8="hybrid", fp8_recipe=FP8_RECIPE, fp8_attention="auto")
    return PrecisionConfig(dtype=name)


def throughput_rows(cfg: CheckConfig, precision: str, peak: float | None, deadline: float,
                    failures: list[str]) -> list[RunRow]:
    rows = []
    for model in cfg.models:
        planned = [RunRow(model, precision, objective, seq, micro_batch_for(model, seq, cfg.smoke))
                   for seq in cfg.seq_lengths for objective in cfg.objectives]
        rows.extend(planned)
        if precision == "fp8":
            attention, why = fp8_attention_here(preset(model).head_dim, FP8_RECIPE, "padded")
            for row in planned:
                row.fp8_attention, row.fp8_attention_reason = attention, why
        if time.monotonic() + cfg.seconds_per_run > deadline:
            skip(planned, "time budget exhausted before this model", failures)
            continue
        trainer = None
        try:
            trainer = Trainer(model, precision_for(precision), cfg.seed)
            for row in planned:
                if time.monotonic() + cfg.seconds_per_run > deadline:
                    skip([row], "time budget exhausted", failures)
                    continue
                try:
                    run_with_oom_fallback(trainer, row, cfg, peak)
                except Exception as err:  # report it, and go on with the next configuration
                    fail(row, err, failures)
                    free_memory()
        except Exception as err:
            for row in planned:
                if row.status == "pending":
                    fail(row, err, failures)
        finally:
            if trainer is not None:
                trainer.close()
    return rows


def skip(rows: list[RunRow], reason: str, failures: list[str]) -> None:
    for row in rows:
        row.status, row.reason = "skipped", reason
        failures.append(f"{label(row)}: {reason}")


def fail(row: RunRow, err: Exception, failures: list[str]) -> None:
    row.status, row.reason = "failed", f"{type(err).__name__}: {err}"
    failures.append(f"{label(row)}: {row.reason}")
    traceback.print_exc()


def label(row: RunRow) -> str:
    return f"{row.model} {row.precision} {row.objective} S={row.seq_length}"


def precision_agreement(cfg: CheckConfig, failures: list[str]) -> dict:
    """bf16 and fp32 from the same initial weights on the same MLM batches: per-step losses must agree."""
    out = {"model": cfg.agreement_model, "seq_length": cfg.agreement_seq, "micro_batch": cfg.agreement_micro_batch,
           "steps": cfg.agreement_steps, "rtol": cfg.agreement_rtol, "fp32_losses": [], "bf16_losses": [],
           "max_rel_diff": None, "passed": False, "error": None}
    trainers = []
    try:
        reference = Trainer(cfg.agreement_model, PrecisionConfig(dtype="fp32"), cfg.seed)
        trainers.append(reference)
        low = Trainer(cfg.agreement_model, PrecisionConfig(dtype="bf16"), cfg.seed, init_from=reference)
        trainers.append(low)
        for trainer, key in ((reference, "fp32_losses"), (low, "bf16_losses")):
            batches = trainer.batches("mlm", cfg.agreement_seq, cfg.agreement_micro_batch, cfg.agreement_steps,
                                      seed=cfg.seed + 1)
            out[key] = [trainer.step(b).loss for b in batches]
        diffs = [abs(a - b) / abs(a) for a, b in zip(out["fp32_losses"], out["bf16_losses"])]
        out["max_rel_diff"] = max(diffs)
        out["passed"] = out["max_rel_diff"] <= cfg.agreement_rtol
        if not out["passed"]:
            failures.append(f"bf16 vs fp32 losses differ by {out['max_rel_diff']:.2e} (relative) > {cfg.agreement_rtol}")
    except Exception as err:
        out["error"] = f"{type(err).__name__}: {err}"
        failures.append(f"bf16 vs fp32 agreement: {out['error']}")
        traceback.print_exc()
    finally:
        for trainer in trainers:
            trainer.close()
    return out


def feature_table(cfg: CheckConfig, peak: float | None, deadline: float, failures: list[str]) -> dict:
    """Defaults vs each feature switched off, at one shape (MLM, bf16), in interleaved rounds.

    Every variant is its own Trainer (same seed, so the same initial weights), all alive together so that the
    rounds can alternate between them; the feature shape is sized so that several 210m models fit one GPU."""
    model, seq = cfg.feature_model, cfg.feature_seq
    micro_batch = micro_batch_for(model, seq, cfg.smoke)
    variants = {"defaults": {}, **{f"{name} off": off for name, off in FEATURES.items()}}
    out = {"model": model, "seq_length": seq, "objective": "mlm", "micro_batch": micro_batch,
           "rounds": cfg.feature_rounds, "steps_per_round": cfg.feature_steps, "rows": [],
           "not_measurable_here": {
               "overlap_grad_reduce / overlap_param_gather": "need data parallelism (> 1 GPU)",
               "NCCL / allocator environment (Slurm executor)": "multi-GPU collectives",
               "gradient_accumulation_fusion": "apex's fused_weight_gradient_mlp_cuda (NGC image only)"}}
    trainers: dict[str, Trainer] = {}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for name, kwargs in variants.items():
            trainers[name] = Trainer(model, PrecisionConfig(dtype="bf16"), cfg.seed, **kwargs)
        batches = trainers["defaults"].batches("mlm", seq, micro_batch, count=4, seed=cfg.seed)
        for trainer in trainers.values():  # warm-up (torch.compile of the fused kernels happens here)
            set_causal(trainer.chunks, False)
            for i in range(cfg.warmup_steps):
                trainer.step(batches[i % len(batches)])
        out["host_syncs_per_step"] = host_syncs_per_step(trainers["defaults"], batches, steps=3)
        for _ in range(cfg.feature_rounds):
            for name, trainer in trainers.items():
                if time.monotonic() > deadline:
                    raise TimeoutError("time budget exhausted in the feature table")
                synchronize()
                start = time.perf_counter()
                for i in range(cfg.feature_steps):
                    trainer.step(batches[i % len(batches)])
                synchronize()
                samples[name].append(cfg.feature_steps * micro_batch * seq / (time.perf_counter() - start))
        base = sorted(samples["defaults"])[len(samples["defaults"]) // 2]
        for name, trainer in trainers.items():
            tokens_per_s = sorted(samples[name])[len(samples[name]) // 2]
            fpt = step_flops_per_token(trainer, "mlm", seq)
            out["rows"].append({"variant": name, "tokens_per_s": tokens_per_s, "rounds": samples[name],
                                "flops_per_token": fpt,
                                "mfu": None if peak is None else mfu(tokens_per_s, fpt, peak),
                                "defaults_speedup": base / tokens_per_s})
    except Exception as err:
        out["error"] = f"{type(err).__name__}: {err}"
        failures.append(f"feature table: {out['error']}")
        traceback.print_exc()
    finally:
        for trainer in trainers.values():
            trainer.close()
    return out


def host_syncs_per_step(trainer: Trainer, batches, steps: int) -> list[int] | None:
    """How often each training step makes the host wait for the GPU, as CUDA's sync debug mode reports it (one
    warning per synchronising call: `.item()`, `.tolist()`, `nonzero`, a device-to-host copy). Issue #12's target
    is one per step (mlmclm.train.step.train_step's read), through the step pretrain runs, its agreed stop flag
    included (issue 23: that flag was a host-to-device copy per step). None without CUDA (the CPU tests count the reads
    themselves: tests/train/test_training_run.py)."""
    if not on_gpu():
        return None
    counts = []
    for i in range(steps):
        synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                trainer.step(batches[i % len(batches)])
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts.append(sum("synchronizing" in str(w.message) for w in caught))
    return counts


def fp8_ratios(rows: list[RunRow]) -> list[dict]:
    bf16 = {(r.model, r.objective, r.seq_length): r for r in rows if r.precision == "bf16" and r.status == "ok"}
    out = []
    for r in rows:
        base = bf16.get((r.model, r.objective, r.seq_length))
        if r.precision == "fp8" and r.status == "ok" and base is not None:
            out.append({"model": r.model, "objective": r.objective, "seq_length": r.seq_length,
                        "fp8_over_bf16": r.tokens_per_s / base.tokens_per_s, "fp8_attention": r.fp8_attention})
    return out


def goals(rows: list[RunRow], ratios: list[dict], smoke: bool) -> dict:
    def find(items, **keys):
        return next((i for i in items if all(_get(i, k) == v for k, v in keys.items())), None)

    target = dict(model="eurobert-1b", objective="mlm", seq_length=2048)
    bf16_row = find([r for r in rows if r.status == "ok"], precision="bf16", **target)
    ratio = find(ratios, **target)
    measured_mfu = None if smoke or bf16_row is None else bf16_row.mfu
    measured_ratio = None if smoke or ratio is None else ratio["fp8_over_bf16"]
    return {
        "bf16_mfu_1b_seq2048_mlm": {"target": GOAL_BF16_MFU, "measured": measured_mfu,
                                    "met": None if measured_mfu is None else measured_mfu >= GOAL_BF16_MFU},
        "fp8_over_bf16_1b_seq2048_mlm": {"target": GOAL_FP8_SPEEDUP, "measured": measured_ratio,
                                         "met": None if measured_ratio is None else measured_ratio >= GOAL_FP8_SPEEDUP},
    }


def _get(item, key):
    return item[key] if isinstance(item, dict) else getattr(item, key)


def resolve_peak(precision: str, override_tflops: float | None) -> tuple[float | None, str]:
    try:
        override = None if override_tflops is None else override_tflops * 1e12
        value = peak_flops(precision, override=override)
        return value, "override (--peak-tflops)" if override is not None else "table (mlmclm.flops.PEAK_FLOPS)"
    except ValueError as err:
        return None, f"unknown: {err}"


# The heads measured at the worst case: the training default (chunked) and megatron's whole head, whose
# [tokens, vocab] logits are what the chunked one exists to avoid; each next to its own estimate.
WORST_CASE_HEADS = {"chunked": DEFAULT_CHUNK_TOKENS, "whole": 0}


def worst_case_memory(cfg: CheckConfig, failures: list[str]) -> dict:
    """Two CLM steps on one micro-batch of `worst_case_samples` samples of `worst_case_length` tokens laid end to
    end (random-length samples at their longest, attention within each), once per head of WORST_CASE_HEADS, peak
    memory measured next to the estimate (mlmclm.model.memory) for this GPU alone: data parallel 1, so the
    optimizer state is not sharded. The top-level figures are the training default's (the chunked head)."""
    from mlmclm.model.document_attention import DocumentLayout

    tokens = cfg.worst_case_samples * cfg.worst_case_length
    result = {"model": cfg.worst_case_model, "tokens": tokens, "samples": cfg.worst_case_samples, "heads": {}}
    trainer = None
    try:
        trainer = Trainer(cfg.worst_case_model, precision_for("bf16" if on_gpu() else "fp32"), cfg.seed,
                          packed_segments=True)
        set_causal(trainer.chunks, True)
        (batch,) = trainer.batches("clm", tokens, 1, count=1, seed=cfg.seed)
        ids = torch.arange(cfg.worst_case_samples).repeat_interleave(cfg.worst_case_length).unsqueeze(0)
        layout = DocumentLayout.from_document_ids(ids).to(current_device())
        for head, chunk_tokens in WORST_CASE_HEADS.items():
            result["heads"][head] = _worst_case_one_head(cfg, trainer, batch, layout, tokens, head, chunk_tokens,
                                                         failures)
    except Exception as err:  # the model did not even build: every head's figure is missing, and says why
        for head in WORST_CASE_HEADS:
            result["heads"].setdefault(head, {"status": f"failed: {type(err).__name__}: {str(err)[:300]}",
                                              "measured_gib": None, "estimated_gib": None, "estimate": "-"})
        failures.append(f"worst-case memory ({cfg.worst_case_model}, {tokens} tokens): {err}")
    finally:
        if trainer is not None:
            trainer.close()
    result.update(result["heads"]["chunked"])
    return result


def _worst_case_one_head(cfg, trainer, batch, layout, tokens, head, chunk_tokens, failures) -> dict:
    from mlmclm.model.memory import GIB, RankLayout, estimate_peak_memory

    estimate = estimate_peak_memory(trainer.model_cfg, RankLayout(data_parallel=1), tokens, predicted_fraction=1.0,
                                    head_chunk_tokens=chunk_tokens)
    out = {"head_chunk_tokens": chunk_tokens, "estimated_gib": estimate.total / GIB, "estimate": estimate.summary(),
           "measured_gib": None, "status": "pending"}
    try:
        reset_peak_memory()
        for _ in range(2):
            trainer.step(batch, documents=[layout], head_chunk_tokens=chunk_tokens)
        synchronize()
        out["measured_gib"], out["memory_kind"] = peak_memory_gib()
        out["status"] = "ok"
    except Exception as err:  # an OOM here is the finding: the estimate said it fits
        out["status"] = f"failed: {type(err).__name__}: {str(err)[:300]}"
        failures.append(f"worst-case memory ({cfg.worst_case_model}, {tokens} tokens, {head} head): {out['status']}")
        free_memory()
    return out


def run_determinism(cfg: CheckConfig, failures: list[str]) -> dict:
    """determinism_check.py in its own processes (deterministic mode must be set before CUDA and NCCL start)."""
    import shutil
    import tempfile

    out = Path(tempfile.mkdtemp(prefix="gpu_check_determinism_"))
    try:
        result = determinism_check(DeterminismConfig.smoke() if cfg.smoke else DeterminismConfig(), out)
    except Exception as err:
        traceback.print_exc()
        result = {"passed": False, "error": f"{type(err).__name__}: {err}"}
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if not result["passed"]:
        failures.append("deterministic runs: " + (result.get("error") or "not bit-identical (see determinism)"))
    return result


def run_check(cfg: CheckConfig) -> dict:
    started = time.monotonic()
    deadline = started + cfg.budget_s
    failures: list[str] = []
    init_parallel(ParallelConfig(), seed=cfg.seed)
    env = environment()
    fp8_ok, fp8_why = fp8_support()
    fp8_override = cfg.peak_tflops_fp8 or (None if cfg.peak_tflops is None else 2 * cfg.peak_tflops)
    peaks = {"bf16": resolve_peak("bf16", cfg.peak_tflops), "fp8": resolve_peak("fp8", fp8_override)}
    rows = throughput_rows(cfg, "bf16", peaks["bf16"][0], deadline, failures)
    if fp8_ok:
        rows += throughput_rows(cfg, "fp8", peaks["fp8"][0], deadline, failures)
    else:
        for model in cfg.models:
            for seq in cfg.seq_lengths:
                for objective in cfg.objectives:
                    rows.append(RunRow(model, "fp8", objective, seq, micro_batch_for(model, seq, cfg.smoke),
                                       status="skipped", reason=fp8_why))
    features = feature_table(cfg, peaks["bf16"][0], deadline, failures) if cfg.features else None
    worst_case = worst_case_memory(cfg, failures)
    agreement = precision_agreement(cfg, failures)
    ratios = fp8_ratios(rows)
    goal_table = goals(rows, ratios, cfg.smoke)
    if cfg.require_goals:
        failures += [f"goal {name} not met: {g}" for name, g in goal_table.items() if g["met"] is not True]
    destroy_parallel()
    determinism = run_determinism(cfg, failures) if cfg.determinism else None
    return {
        "mode": "smoke" if cfg.smoke else "gpu",
        "data": "uniformly random tokens (throughput does not depend on token values)",
        "environment": env,
        "peak_tflops": {p: (None if v is None else v / 1e12) for p, (v, _) in peaks.items()},
        "peak_source": {p: why for p, (_, why) in peaks.items()},
        "memory_kind": peak_memory_gib()[1],
        "flop_convention": "model FLOPs: 6 x forward MACs; LM head at every position for CLM and at the masked "
                           "positions only for MLM with the sparse head; causal attention counted at half "
                           "(mlmclm.flops)",
        "fp8": {"available": fp8_ok, "reason": fp8_why,
                "recipe": FP8_RECIPE,
                "attention": {m: fp8_attention_here(preset(m).head_dim, FP8_RECIPE, "padded")[1] for m in cfg.models},
                "ratios": ratios},
        "precision_agreement": agreement,
        "features": features,
        "worst_case_memory": worst_case,
        "determinism": determinism,
        "runs": [asdict(r) for r in rows],
        "goals": goal_table,
        "config": asdict(cfg),
        "total_seconds": time.monotonic() - started,
        "failures": failures,
        "ok": not failures,
    }


# ---- output ----------------------------------------------------------------------------------------------------

def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_report(report: dict) -> str:
    env = report["environment"]
    lines = [
        f"torch {env['torch']}  CUDA {env['cuda']}  TE {env['transformer_engine']}  apex {env['apex']}  "
        f"megatron-core {env['megatron_core']}  device {env['device']['name']}",
        f"layer spec: {env['layer_spec']} ({env['layer_spec_reason']})",
        env["fused_kernels"],
        f"peak TFLOP/s: bf16 {_fmt(report['peak_tflops']['bf16'], '.4g')}, fp8 {_fmt(report['peak_tflops']['fp8'], '.4g')}"
        f"  [{report['peak_source']['bf16']}]   data: {report['data']}",
        f"{'model':<14}{'prec':<5}{'obj':<4}{'seq':>5}{'mbs':>4}{'steps':>6}{'tok/s':>11}{'TFLOP/s':>9}{'MFU':>7}"
        f"{'mem GiB':>8}{'loss':>8}  status",
    ]
    for r in report["runs"]:
        lines.append(
            f"{r['model']:<14}{r['precision']:<5}{r['objective']:<4}{r['seq_length']:>5}{r['micro_batch']:>4}"
            f"{r['timed_steps']:>6}{_fmt(r['tokens_per_s'], ',.0f'):>11}{_fmt(r['tflops_per_gpu'], '.2f'):>9}"
            f"{'-' if r['mfu'] is None else format(100 * r['mfu'], '.1f') + '%':>7}{_fmt(r['peak_memory_gib'], '.1f'):>8}"
            f"{_fmt(r['last_loss'], '.3f'):>8}  {r['status']}{' (' + r['reason'] + ')' if r['reason'] else ''}")
    fp8 = report["fp8"]
    lines.append(f"FP8: {fp8['reason']}")
    for model, why in fp8["attention"].items():
        lines.append(f"  {model}: {why}")
    for ratio in fp8["ratios"]:
        lines.append(f"  FP8/bf16 {ratio['model']} {ratio['objective']} S={ratio['seq_length']}: "
                     f"{ratio['fp8_over_bf16']:.2f}x")
    features = report.get("features")
    if features:
        lines.append(f"features on vs off ({features['model']} MLM S={features['seq_length']} "
                     f"mbs={features['micro_batch']}, median of {features['rounds']} interleaved rounds):")
        for row in features["rows"]:
            mfu_text = "-" if row["mfu"] is None else f"{100 * row['mfu']:.1f}%"
            lines.append(f"  {row['variant']:<32}{row['tokens_per_s']:>11,.0f} tok/s  MFU {mfu_text:>6}  "
                         f"defaults are {row['defaults_speedup']:.2f}x")
        if "host_syncs_per_step" in features:
            syncs = features["host_syncs_per_step"]
            lines.append("  host synchronisations per step (defaults; target 1): "
                         + ("- (no CUDA)" if syncs is None else " ".join(map(str, syncs))))
        for what, why in features["not_measurable_here"].items():
            lines.append(f"  not measured: {what} ({why})")
    worst = report["worst_case_memory"]
    lines.append(f"peak memory at the worst-case micro-batch ({worst['model']}, CLM, {worst['samples']} samples, "
                 f"{worst['tokens']:,} tokens):")
    for head, figures in worst["heads"].items():
        estimated = "-" if figures["estimated_gib"] is None else f"{figures['estimated_gib']:.1f}"
        lines.append(f"  {head} head: measured {_fmt(figures['measured_gib'], '.1f')} GiB, estimated {estimated} "
                     f"GiB [{figures['estimate']}] -> {figures['status']}")
    det = report.get("determinism")
    if det:
        lines.append("deterministic: true, step by step (loss, grad norm) against reference run A:")
        for name, key in (("same seed, another process", "same_seed"), ("stopped and resumed", "stop_and_resume")):
            if key in det:
                r = det[key]
                verdict = "bit-identical" if r["bit_identical"] else f"DIFFERS from step {r['first_differing_step']}"
                lines.append(f"  {name:<28}{verdict}  max |loss diff| {r['max_abs_loss_diff']:.3g}, max grad-norm "
                             f"rel diff {r['max_rel_grad_norm_diff']:.3g} over {r['steps']} steps")
        lines.append(f"  -> {'PASS' if det['passed'] else 'FAIL ' + str(det.get('error') or '')}")
    agr = report["precision_agreement"]
    lines.append(f"bf16 vs fp32 ({agr['model']}, {agr['steps']} MLM steps): max relative loss difference "
                 f"{_fmt(agr['max_rel_diff'], '.5f')} (tolerance {agr['rtol']}) -> "
                 f"{'PASS' if agr['passed'] else 'FAIL ' + str(agr['error'] or '')}")
    for name, g in report["goals"].items():
        state = "not measured" if g["measured"] is None else f"{g['measured']:.3f} -> {'met' if g['met'] else 'MISSED'}"
        lines.append(f"goal {name} >= {g['target']}: {state}")
    lines.append(f"total {report['total_seconds']:.0f} s; " + ("OK" if report["ok"] else
                                                               f"{len(report['failures'])} FAILURE(S):"))
    lines += [f"  - {f}" for f in report["failures"]]
    return "\n".join(lines)


def parse_args(argv=None) -> tuple[CheckConfig, Path | None]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU-sized check with a tiny shape (CI)")
    p.add_argument("--json", type=Path, help="write the report as JSON here")
    p.add_argument("--models", nargs="+", help="model presets (default: eurobert-210m eurobert-1b)")
    p.add_argument("--seq-lengths", nargs="+", type=int)
    p.add_argument("--objectives", nargs="+", choices=["mlm", "clm"])
    p.add_argument("--max-steps", type=int, help="timed steps per configuration, at most")
    p.add_argument("--seconds-per-run", type=float, help="time box per configuration")
    p.add_argument("--budget-s", type=float, help="time budget of the whole check")
    p.add_argument("--peak-tflops", type=float, help="bf16 peak TFLOP/s of one device (overrides the table)")
    p.add_argument("--peak-tflops-fp8", type=float, help="fp8 peak TFLOP/s (default: 2x --peak-tflops if given)")
    p.add_argument("--agreement-rtol", type=float, help="bf16-vs-fp32 relative loss tolerance (default 0.01)")
    p.add_argument("--no-features", action="store_true", help="skip the features on-vs-off table")
    p.add_argument("--no-determinism", action="store_true", help="skip the deterministic-runs comparison")
    p.add_argument("--require-goals", action="store_true", help="also fail when a performance goal is missed")
    a = p.parse_args(argv)
    for name in a.models or []:
        if name not in PRESETS:
            p.error(f"unknown model preset {name!r}; choose from {sorted(PRESETS)}")
    overrides = {k: v for k, v in dict(models=a.models, seq_lengths=a.seq_lengths, objectives=a.objectives,
                                       max_steps=a.max_steps, seconds_per_run=a.seconds_per_run,
                                       budget_s=a.budget_s, peak_tflops=a.peak_tflops,
                                       peak_tflops_fp8=a.peak_tflops_fp8,
                                       agreement_rtol=a.agreement_rtol,
                                       require_goals=a.require_goals or None,
                                       features=False if a.no_features else None,
                                       determinism=False if a.no_determinism else None).items() if v is not None}
    cfg = CheckConfig.smoke_defaults(**overrides) if a.smoke else CheckConfig(**overrides)
    return cfg, a.json


def main(argv=None) -> int:
    logging.basicConfig(level=logging.WARNING)
    cfg, json_path = parse_args(argv)
    if not cfg.smoke and not on_gpu():
        print("error: no CUDA device; run with --smoke for the CPU check", file=sys.stderr)
        return 2
    report = run_check(cfg)
    print(format_report(report))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2))
        print(f"wrote {json_path}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
