"""The next global batch, built on the host while the current step runs.

Building a step's batches is host work: the loader's sampling and gather (`next_global_batch`), the objective's
masking and labels, the sparse head's positions, the attention layouts of packed segments, the masking metrics.
Done between two steps, it leaves the GPU idle for as long as it takes. `StepBatches` does it one step ahead on a
single background thread of the rank's own process (no worker process): while step k trains, the thread builds
step k + 1's batches; `get(k + 1)` then only copies them to the device (pinned, non-blocking) on the main thread.

Same batches, bit for bit: every piece is a pure function of (seed, data position, step) — counter-based masks, the
loader's seeded orders — built by one thread in step order, exactly as the loop built them. The thread never
touches CUDA (host tensors only); the main thread owns the device.

Exact resume: a batch carries the data position after it (`loaders`, `consumed_samples`: what `PhaseLoaders`
reports once it is taken). A checkpoint saves the position of the last batch *trained*, not that of the loaders,
which stand one step further when the thread has built ahead.
"""
from __future__ import annotations

import signal
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from mlmclm.model.document_attention import DocumentLayout, attention_layout
from mlmclm.model.sparse_head import flat_positions
from mlmclm.objectives import ObjectiveBatch, objective_for_tokenizer
from mlmclm.parallel.runtime import to_device
from mlmclm.train.config import TrainConfig
from mlmclm.train.phase_data import PhaseLoaders
from mlmclm.train.signals import STOP_SIGNALS


@dataclass
class HostStep:
    """One step's inputs on the host, and the data position after them."""

    iteration: int
    batches: list[ObjectiveBatch]
    predicted: list[torch.Tensor] | None      # the sparse head's positions (MLM), found on the host
    documents: list[DocumentLayout] | None    # packed segments: random-length samples, per-document attention
    masking: dict                             # the scheduled and realised mask rates (MLM)
    lengths: np.ndarray | None                # random-length samples: every sample's length (tokens, FLOPs)
    loaders: list[dict] = field(default_factory=list)
    consumed_samples: int = 0

    def to(self, device) -> tuple[list[ObjectiveBatch], list[torch.Tensor] | None, list[DocumentLayout] | None]:
        """The batches, positions and layouts on `device` (main thread: pinned, non-blocking copies)."""
        batches = [batch.to(device) for batch in self.batches]
        predicted = None if self.predicted is None else [to_device(p, device) for p in self.predicted]
        documents = None if self.documents is None else [layout.to(device) for layout in self.documents]
        return batches, predicted, documents


def masking_metrics(mask_ratio: float | None, batches) -> dict:
    """An MLM step's scheduled mask rate and the rate its masks realised (this data-parallel rank's micro-batches:
    masked / maskable tokens, counted on the host before the batches went over, so no device read)."""
    if mask_ratio is None:
        return {}
    maskable = sum(int(batch.num_maskable) for batch in batches)
    masked = sum(int(batch.num_predicted) for batch in batches)
    return {"train/mask_ratio": mask_ratio, "train/mask_ratio_realised": masked / maskable if maskable else 0.0}


def build_host_step(cfg: TrainConfig, data: PhaseLoaders, objectives: dict, tokenizer: dict,
                    iteration: int) -> HostStep:
    """Step `iteration`'s batches from its phase's loader, as the training loop consumes them. `objectives`
    caches each phase's objective (pure: the same as the loop's own)."""
    index = cfg.phase_at(iteration)
    phase = cfg.phases[index]
    if index not in objectives:
        objectives[index] = objective_for_tokenizer(phase.objective, tokenizer, cfg.seed)
    objective = objectives[index]
    loader = data.for_phase(index)
    micro = loader.next_global_batch()
    start, stop = cfg.phase_bounds()[index]
    mask_ratio = None if objective.causal else phase.objective.ratio_at(iteration - start, stop - start)
    rate = {} if mask_ratio is None else {"mask_ratio": mask_ratio}  # this step's rate of the phase's schedule
    # MLM masks are counter-based (the same on every device): made here, the positions, whose count decides the
    # head's shapes, are known without reading the device (a second host synchronisation per step on a GPU).
    batches = [objective.prepare(mb["tokens"], mb["sample_ids"], mb.get("positions"), **rate) for mb in micro]
    predicted = None
    if cfg.sparse_mlm_head and not objective.causal:
        predicted = flat_positions([batch.loss_mask for batch in batches])
    documents = None
    if cfg.per_document_attention or cfg.data.random_length is not None:  # segment boundaries, found on the host
        documents = [attention_layout(mb, cfg.per_document_attention) for mb in micro]
    lengths = getattr(loader, "last_lengths", None)
    return HostStep(iteration, batches, predicted, documents, masking_metrics(mask_ratio, batches),
                    None if lengths is None else lengths.copy(), data.state_dict(), data.consumed_samples)


def _stop_signals_to_main() -> None:
    """The thread blocks the stop signals, so the kernel delivers them to the main thread, whose mask decides
    (`signals.stop_signals_blocked` holds them pending during a save)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


class StepBatches:
    """Step batches for iterations [first, end), each built one step ahead on one background thread
    (`background=False`: built when asked for, as the loop did before). `get(k)` must be called for k = first,
    first + 1, ... in order; `close()` stops the thread without waiting for it (a batch built ahead is dropped,
    the loaders' advance with it: the checkpoint holds the position of the last batch handed out)."""

    def __init__(self, cfg: TrainConfig, data: PhaseLoaders, tokenizer: dict, first: int, end: int,
                 background: bool = True):
        self.cfg, self.data, self.tokenizer, self.end = cfg, data, tokenizer, end
        self.objectives: dict = {}
        self.expected = first
        self.pool = (ThreadPoolExecutor(1, thread_name_prefix="batch-prefetch", initializer=_stop_signals_to_main)
                     if background else None)
        self.ahead: Future | None = None
        self.last: HostStep | None = None
        self.built_ahead = 0  # steps whose batch the thread had built (benchmarks report it)

    def _build(self, iteration: int) -> HostStep:
        return build_host_step(self.cfg, self.data, self.objectives, self.tokenizer, iteration)

    def get(self, iteration: int) -> HostStep:
        if iteration != self.expected:
            raise RuntimeError(f"batches are built in step order: asked for step {iteration}, the next is "
                               f"{self.expected}")
        if self.ahead is not None:
            step, self.ahead = self.ahead.result(), None  # the thread's error, if any, is raised here
            self.built_ahead += 1
        else:
            step = self._build(iteration)
        self.expected = iteration + 1
        if self.pool is not None and self.expected < self.end:
            self.ahead = self.pool.submit(self._build, self.expected)
        self.last = step
        return step

    def position(self) -> tuple[int, list[dict]]:
        """(consumed samples, loader states) after the last batch handed out (before the first: the loaders', which
        no thread has moved yet)."""
        if self.last is None:
            return self.data.consumed_samples, self.data.state_dict()
        return self.last.consumed_samples, self.last.loaders

    def close(self) -> None:
        """Stops the thread without waiting for a batch it is building: that batch is dropped anyway (the checkpoint
        holds the position of the last batch handed out), and its build may be stalled on a shard read for minutes
        (remote.STALL_S), which must not hold a preemption's exit. The caller closes the loaders next, which
        abandons their reads in flight, so the build then ends with an error nobody reads."""
        if self.ahead is not None:
            self.ahead.cancel()  # not started yet: never starts
            self.ahead = None
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
