"""What the GPU checks train with: one model, its DDP wrapper, optimizer and scheduler (`Trainer`), stepping through
the training step `pretrain` runs (`mlmclm.train.step.train_step`, its stop flag included), and the batches it is
fed — as training makes them: random-length samples laid end to end (the paper's recipe, packed THD segments on TE
layers with the fused RoPE; the training default) or fixed padded rows (what FP8 attention needs). The speed rows
take them through pretrain's own batch path (`PretrainBatches`: the run's loaders over a dataset on disk, each
step's batches built ahead on the prefetch thread, then copied to the device as pretrain copies them); the memory
and comparison sections put a few micro-batches on the device once (`random_length_inputs`).

Benchmarks may touch torch.cuda (the library may not): the device helpers are here too.
"""
from __future__ import annotations

import gc
import math
import resource
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mlmclm.data.random_length import SampleLengths, sample_lengths
from mlmclm.model import PrecisionConfig, build_model, preset, set_causal
from mlmclm.model.build import attention_path
from mlmclm.model.head_chunks import DEFAULT_CHUNK_TOKENS
from mlmclm.model.document_attention import DocumentLayout, attention_layout
from mlmclm.model.sparse_head import flat_positions
from mlmclm.objectives import ObjectiveConfig, build_objective
from mlmclm.parallel import ParallelConfig, current_device
from mlmclm.train.optim import OptimizerConfig, ScheduleConfig, build_optimizer, wrap_ddp
from mlmclm.train.schedule_restarts import build_scheduler
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
    """One step's micro-batches on the device, as train_step takes them, and the real tokens they hold."""

    batches: list
    positions: list | None
    layouts: list | None
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
    return StepInput([batch.to(device)], None if positions is None else [p.to(device) for p in positions],
                     None if layout is None else [layout.to(device)], lengths)


def synthetic_dataset(work: Path, vocab: int, seq_length: int, rows: int, seed: int) -> Path:
    """A prepared dataset of `rows` rows of random token ids (one document per row) in the model's vocabulary, as
    `prepare_data` lays one out: what the speed rows' loaders read (made once per work folder and shape)."""
    from mlmclm.data.manifest import Manifest
    from mlmclm.data.shards import write_shard

    out = work / f"synthetic_v{vocab}_s{seq_length}_r{rows}_{seed}"
    if (out / "manifest.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokens = np.random.default_rng(seed).integers(len(SPECIAL_IDS), vocab, (rows, seq_length), dtype=np.int64)
    info = write_shard(out / "shard-000000.tar", [(tokens.astype(np.int32), np.zeros(0, dtype=np.int64))], PAD_ID)
    tokenizer = {"name": "synthetic-random", "vocab_size": vocab, "pad_id": PAD_ID, "bos_id": 1, "eos_id": 2,
                 "mask_id": MASK_ID}
    Manifest(seq_length=seq_length, num_samples=rows, num_tokens=info.num_tokens, tokenizer=tokenizer,
             shards=[info], num_documents=rows, dtype="int32",
             command="benchmarks/gpu_trainer.synthetic_dataset").save(out)
    return out


class PretrainBatches:
    """Step inputs through pretrain's own batch path: the run's loaders (`PhaseLoaders`: random-length samples cut
    from prepared rows, or whole rows) over a dataset on disk, each step's batches built one step ahead on the
    prefetch thread (`StepBatches`), then `HostStep.to(device)`: the pinned, non-blocking copies pretrain makes —
    so that a timed step pays what a training step pays for its batches. `built_ahead`: the steps whose batch the
    thread had ready."""

    def __init__(self, trainer: "Trainer", objective: str, samples: int, lengths: SampleLengths | None,
                 steps: int, seed: int, work: Path, precision: PrecisionConfig, row_length: int | None = None):
        from mlmclm.train.config import TrainConfig
        from mlmclm.train.phase_data import PhaseLoaders, padding
        from mlmclm.train.prefetch import StepBatches

        seq = lengths.max_length if lengths is not None else row_length
        rows = steps * samples + 8  # enough for every step even at the longest lengths: no epoch wraps mid-run
        path = synthetic_dataset(work, trainer.model_cfg.vocab_size, seq, rows, seed)
        data = {"path": str(path)}
        if lengths is not None:
            data["random_length"] = {"min_length": lengths.min_length, "max_length": lengths.max_length}
        cfg = TrainConfig.from_dict({
            "run_dir": str(work / "run"), "model": {"preset": trainer.model_name, **trainer.shape}, "data": data,
            "phases": [{"objective": {"kind": objective}, "steps": steps}], "total_steps": steps,
            "global_batch_size": samples, "micro_batch_size": samples, "seed": seed,
            "precision": precision_dict(precision), "sparse_mlm_head": trainer.sparse_head,
            "head_chunk_tokens": trainer.head_chunk_tokens})
        self.data = PhaseLoaders(cfg, 0, 1, **padding(cfg))
        self.batches = StepBatches(cfg, self.data, self.data.manifest.tokenizer, 0, steps)
        self.step = 0

    @property
    def built_ahead(self) -> int:
        return self.batches.built_ahead

    def next(self) -> StepInput:
        host = self.batches.get(self.step)
        self.step += 1
        batches, predicted, documents = host.to(current_device())
        lengths = host.lengths.tolist() if host.lengths is not None else \
            [batch.input_ids.shape[1] for batch in host.batches for _ in range(batch.input_ids.shape[0])]
        return StepInput(batches, predicted, documents, lengths)

    def close(self) -> None:
        self.batches.close()
        self.data.close()


def precision_dict(precision: PrecisionConfig) -> dict:
    from mlmclm import config_io

    return config_io.to_dict(precision)


# ---- the trainer -----------------------------------------------------------------------------------------------

class Trainer:
    """One model, its DDP wrapper, optimizer and scheduler; steps through `train_step` with the training defaults:
    the chunked head (`head_chunk_tokens` = DEFAULT_CHUNK_TOKENS), the sparse MLM head, manual GC every 100."""

    def __init__(self, model_name: str, precision: PrecisionConfig, seed: int, packed_segments: bool = True,
                 sparse_head: bool = True, fused_kernels: bool = True, manual_gc_interval: int = 100,
                 head_chunk_tokens: int = DEFAULT_CHUNK_TOKENS, deterministic: bool = False,
                 max_row_tokens: int | None = None, rows: int = 1, **shape):
        """`max_row_tokens` (`rows` per micro-batch): the longest row it will train on — local layers on packed
        segments too long for their mask are refused as pretrain refuses them (mlmclm.model.build)."""
        self.model_name, self.shape = model_name, shape
        self.model_cfg = preset(model_name, **shape)
        self.sparse_head, self.head_chunk_tokens = sparse_head, head_chunk_tokens
        self.manual_gc = ManualGC(manual_gc_interval)
        self.steps_done = 0
        torch.manual_seed(seed)
        self.chunks = build_model(self.model_cfg, ParallelConfig(), precision, causal=False,
                                  fused_kernels=fused_kernels, packed_segments=packed_segments,
                                  deterministic=deterministic, max_row_tokens=max_row_tokens, rows=rows)
        self.attention = attention_path(self.chunks)  # what was built: a TE fallback to local layers says "local"
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
        result = train_step(self.ddp, self.optimizer, self.scheduler, item.batches, sparse_head=self.sparse_head,
                            predicted_positions=item.positions, stop_flag=self.stop.agreed_flag,
                            documents=item.layouts, head_chunk_tokens=chunk)
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
