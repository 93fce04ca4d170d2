"""What the GPU checks train with: one model, its DDP wrapper, optimizer and scheduler (`Trainer`), stepping through
the training step `pretrain` runs (`mlmclm.train.step.train_step`, its stop flag included), and the batches it is
fed — as training makes them: random-length samples laid end to end (the paper's recipe, packed THD segments on TE
layers with the fused RoPE; the training default) or fixed padded rows (what FP8 attention needs).

Benchmarks may touch torch.cuda (the library may not): the device helpers are here too.
"""
from __future__ import annotations

import gc
import math
import resource
import warnings
from dataclasses import dataclass

import torch

from mlmclm.data.random_length import SampleLengths, sample_lengths
from mlmclm.model import PrecisionConfig, build_model, preset, set_causal
from mlmclm.model.chunked_head import DEFAULT_CHUNK_TOKENS
from mlmclm.model.document_attention import DocumentLayout, attention_layout
from mlmclm.model.sparse_head import flat_positions
from mlmclm.objectives import ObjectiveConfig, build_objective
from mlmclm.parallel import ParallelConfig, current_device
from mlmclm.train.optim import OptimizerConfig, ScheduleConfig, build_optimizer, build_scheduler, wrap_ddp
from mlmclm.train.signals import StopRequest
from mlmclm.train.step import ManualGC, configure_model_for_schedules, train_step

SPECIAL_IDS = [0, 1, 2, 3]  # pad, bos, eos, mask: never drawn as data, never masked
PAD_ID, MASK_ID = 0, 3


# ---- device queries ----------------------------------------------------------------------------------------------

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


def host_syncs(step, count: int) -> list[int] | None:
    """How often each of `count` calls of `step(i)` makes the host wait for the GPU, as CUDA's sync debug mode
    reports it (one warning per synchronising call: `.item()`, `.tolist()`, `nonzero`, a device-to-host copy).
    The target is one per training step (train_step's read). None without CUDA."""
    if not on_gpu():
        return None
    counts = []
    for i in range(count):
        synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step(i)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts.append(sum("synchronizing" in str(w.message) for w in caught))
    return counts


# ---- precision -------------------------------------------------------------------------------------------------

def precision_for(name: str, fp8_attention: str = "auto") -> PrecisionConfig:
    """"bf16", "fp32", or an FP8 recipe name ("tensorwise", "delayed", ...): FP8 GEMMs, bf16 elsewhere."""
    if name in ("bf16", "fp32"):
        return PrecisionConfig(dtype=name)
    return PrecisionConfig(dtype="bf16", fp8="hybrid", fp8_recipe=name, fp8_attention=fp8_attention)


# ---- batches ---------------------------------------------------------------------------------------------------

@dataclass
class StepInput:
    """One micro-batch on the device, as train_step takes it, and the real tokens it holds."""

    batch: object
    positions: list | None
    layout: DocumentLayout | None
    lengths: list[int]  # the samples' lengths (fixed rows: the row length, once per row)


def random_length_inputs(objective, vocab: int, samples: int, lengths: SampleLengths, count: int, seed: int,
                         pad_multiple: int = 16) -> list[StepInput]:
    """`count` micro-batches of `samples` random-length samples each, laid end to end in one row and padded as the
    loader pads them (sample id -1, the padding cut into short segments): the training default's layout."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        first = i * samples
        sizes = sample_lengths(seed, first, samples, lengths).tolist()
        real = sum(sizes)
        width = -(-real // pad_multiple) * pad_multiple
        tokens = torch.full((1, width), PAD_ID, dtype=torch.long)
        tokens[0, :real] = torch.randint(len(SPECIAL_IDS), vocab, (real,), generator=gen)
        ids = torch.full((1, width), -1, dtype=torch.long)
        ids[0, :real] = torch.repeat_interleave(torch.arange(first, first + samples), torch.tensor(sizes))
        positions = torch.cat([torch.arange(n) for n in sizes] + [torch.arange(width - real)])[None]
        layout = attention_layout({"sample_ids": ids, "document_ids": torch.zeros_like(ids)}, per_document=False)
        out.append(_on_device(objective.prepare(tokens, ids, positions), layout, sizes))
    return out


def padded_inputs(objective, vocab: int, rows: int, seq: int, count: int, seed: int) -> list[StepInput]:
    """`count` micro-batches of `rows` fixed rows of `seq` random tokens (attention across the whole row)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        tokens = torch.randint(len(SPECIAL_IDS), vocab, (rows, seq), generator=gen)
        out.append(_on_device(objective.prepare(tokens, torch.arange(i * rows, (i + 1) * rows)), None, [seq] * rows))
    return out


def _on_device(batch, layout, lengths) -> StepInput:
    positions = None if batch.causal else flat_positions([batch.loss_mask])  # found on the host, as pretrain does
    device = current_device()
    return StepInput(batch.to(device), None if positions is None else [p.to(device) for p in positions],
                     None if layout is None else layout.to(device), lengths)


# ---- the trainer -----------------------------------------------------------------------------------------------

class Trainer:
    """One model, its DDP wrapper, optimizer and scheduler; steps through `train_step` with the training defaults:
    the chunked head (`head_chunk_tokens` = DEFAULT_CHUNK_TOKENS), the sparse MLM head, manual GC every 100."""

    def __init__(self, model_name: str, precision: PrecisionConfig, seed: int, packed_segments: bool = True,
                 sparse_head: bool = True, fused_kernels: bool = True, manual_gc_interval: int = 100,
                 head_chunk_tokens: int = DEFAULT_CHUNK_TOKENS, deterministic: bool = False, **shape):
        self.model_cfg = preset(model_name, **shape)
        self.sparse_head, self.head_chunk_tokens = sparse_head, head_chunk_tokens
        self.manual_gc = ManualGC(manual_gc_interval)
        self.steps_done = 0
        torch.manual_seed(seed)
        self.chunks = build_model(self.model_cfg, ParallelConfig(), precision, causal=False,
                                  fused_kernels=fused_kernels, packed_segments=packed_segments,
                                  deterministic=deterministic)
        self.fp8_attention = bool(getattr(self.chunks[0].config, "fp8_dot_product_attention", False))
        self.ddp = wrap_ddp(self.chunks, distributed_optimizer=True)
        opt_cfg = OptimizerConfig(lr=1e-4)  # small and constant: the checks measure speed, not learning
        self.optimizer = build_optimizer(self.ddp, opt_cfg)
        self.scheduler = build_scheduler(self.optimizer, opt_cfg, ScheduleConfig(style="constant"), total_steps=10**6)
        configure_model_for_schedules(self.ddp, self.optimizer)
        # pretrain's step reads an agreed stop flag with its other numbers; no signal handler here (the session
        # script's timeout must still be able to stop this process).
        self.stop = StopRequest(signals=())
        self.objective_configs = {kind: ObjectiveConfig(kind) for kind in ("mlm", "clm")}
        self.objectives = {kind: build_objective(self.objective_configs[kind], special_token_ids=SPECIAL_IDS,
                                                 mask_token_id=MASK_ID, vocab_size=self.model_cfg.vocab_size,
                                                 seed=seed, pad_token_id=PAD_ID) for kind in ("mlm", "clm")}

    def use(self, objective: str) -> None:
        set_causal(self.chunks, objective == "clm")

    def step(self, item: StepInput, head_chunk_tokens: int | None = None):
        # Each step under this trainer's own GC regime (as its pretrain would run): several trainers may alternate
        # in one process and the collector is process-wide.
        if self.manual_gc.interval:
            gc.disable()
        else:
            gc.enable()
        chunk = self.head_chunk_tokens if head_chunk_tokens is None else head_chunk_tokens
        result = train_step(self.ddp, self.optimizer, self.scheduler, [item.batch], sparse_head=self.sparse_head,
                            predicted_positions=item.positions, stop_flag=self.stop.agreed_flag,
                            documents=None if item.layout is None else [item.layout], head_chunk_tokens=chunk)
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
def copy_weights(src: Trainer, dst: Trainer) -> None:
    params = dict(p for c in dst.chunks for p in c.named_parameters())
    for c in src.chunks:
        for name, param in c.named_parameters():
            params[name].copy_(param.to(params[name].dtype))
