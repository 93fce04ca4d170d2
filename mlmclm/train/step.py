"""One training step on megatron's pipeline schedules: forward/backward over micro-batches, guard, update."""
from __future__ import annotations

import gc
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import finalize_model_grads
from megatron.core.pipeline_parallel import get_forward_backward_func

from mlmclm.model.chunked_head import ChunkedHead, chunked_head_loss
from mlmclm.model.document_attention import (DocumentLayout, block_diagonal_mask, packed_seq_params,
                                             positions_end_to_end, rows_end_to_end)
from mlmclm.model.sparse_head import flat_positions, select_labels, sparse_head_loss
from mlmclm.model.weights import unwrap
from mlmclm.objectives import ObjectiveBatch
from mlmclm.objectives.loss import AccuracyTap
from mlmclm.parallel.runtime import current_device
from mlmclm.train.guarded_update import clip_and_update, prepare_main_grads, squared_grad_norm


class ManualGC:
    """Python's cyclic garbage collector run every `interval` steps instead of whenever allocation counts say.

    An automatic collection pauses one rank at a random moment and every other rank waits for it at the next
    collective; collecting at the same steps everywhere keeps the ranks in step (megatron's `--manual-gc`, on in
    NVIDIA's Megatron-Bridge recipes with `manual_gc_interval=100`). `interval=0` leaves the collector automatic.

        gc_control = ManualGC(100); gc_control.start(); ... gc_control.step(iteration) ...; gc_control.stop()
    """

    def __init__(self, interval: int):
        if interval < 0:
            raise ValueError(f"manual_gc_interval must be >= 0, got {interval}")
        self.interval, self._was_enabled = interval, None

    def start(self) -> None:
        if self.interval and self._was_enabled is None:
            self._was_enabled = gc.isenabled()
            gc.disable()
            gc.collect()

    def step(self, iteration: int) -> None:
        if self.interval and iteration % self.interval == 0:
            gc.collect()

    def stop(self) -> None:
        """Give the collector back as it was found (the process may go on, e.g. a test or the next run)."""
        if self._was_enabled:
            gc.enable()
        self._was_enabled = None


@dataclass
class StepResult:
    loss: float  # mean over every predicted token of the global batch
    accuracy: float
    predicted_tokens: int
    grad_norm: float | None
    lr: float
    skipped: bool  # non-finite loss or gradients: no update was made
    stop_requested: bool = False  # the agreed stop flag handed to train_step (a preemption signal reached a rank)


def _loss_func(loss_mask: torch.Tensor, correct: torch.Tensor, token_losses: torch.Tensor):
    """Summed loss over predicted tokens (megatron divides by the global batch's count), and logging stats."""
    return _summed_loss_func(loss_mask, correct, (token_losses.float() * loss_mask).sum())


def _summed_loss_func(loss_mask: torch.Tensor, correct: torch.Tensor, loss_sum: torch.Tensor):
    """`_loss_func` for a head that returns Σ loss_mask × per-token loss itself (the chunked head, which computes
    that sum's gradient in its forward): handed to megatron's schedule as it is."""
    count = loss_mask.sum()
    stats = torch.stack([loss_sum.detach(), count.detach(), correct.detach().to(count.dtype)])
    return loss_sum, count.to(torch.int), {"stats": stats}


def _forward_step(data_iterator, model, head_chunk_tokens: int = 0):
    batch, predicted, attention = next(data_iterator)
    seq = batch.input_ids.shape[1]
    positions = torch.arange(seq, device=batch.input_ids.device).unsqueeze(0).expand_as(batch.input_ids)
    if predicted is None:
        # Full head: per-token losses [b, s] (megatron's vocab-parallel CE on its [s, b, v] logits, or chunked).
        labels, loss_mask, head = batch.labels.clamp(min=0), batch.loss_mask, {}
    else:
        # Sparse head: the output layer and CE only at the labelled positions; losses [1, n], every one counted.
        labels = select_labels(batch.labels, predicted)
        loss_mask = torch.ones(labels.shape, dtype=batch.loss_mask.dtype, device=labels.device)
        head = {"output_processor": sparse_head_loss, "output_processor_context": predicted}
    chunked = None
    if head_chunk_tokens:
        # The chunked head (mlmclm.model.chunked_head) over the same positions; it counts accuracy itself.
        chunked = ChunkedHead(head_chunk_tokens, positions=predicted, loss_mask=None if predicted is not None
                              else loss_mask)
        head = {"output_processor": chunked_head_loss, "output_processor_context": chunked}
    tap = getattr(unwrap(model), "accuracy_tap", None)  # only on the chunk that holds the output layer
    if tap is not None:
        tap.labels, tap.loss_mask = labels, loss_mask
    output = model(batch.input_ids, positions, attention.get("attention_mask"), labels=labels,
                   packed_seq_params=attention.get("packed_seq_params"), **head)
    if chunked is not None:  # its output is already the loss summed with the mask's weights
        return output, partial(_summed_loss_func, loss_mask, chunked.correct)
    return output, partial(_loss_func, loss_mask, tap.take() if tap is not None else None)


def configure_model_for_schedules(ddp_chunks, optimizer) -> None:
    """Wire megatron's hooks: gradient finalisation (DP all-reduce, division by the token count) and no_sync."""
    for chunk in ddp_chunks:
        model = unwrap(chunk)
        if model.post_process and getattr(model, "accuracy_tap", None) is None:
            model.accuracy_tap = AccuracyTap()
            model.output_layer.register_forward_hook(model.accuracy_tap)
    config = ddp_chunks[0].module.config
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    no_sync = [chunk.no_sync for chunk in ddp_chunks]
    config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
    if ddp_chunks[0].ddp_config.overlap_grad_reduce:
        # As megatron's own training loop: the pipeline schedules start each chunk's grad reduction themselves.
        grad_sync = [chunk.start_grad_sync for chunk in ddp_chunks]
        config.grad_sync_func = grad_sync[0] if len(grad_sync) == 1 else grad_sync


def document_attention_inputs(batch: ObjectiveBatch, layout: DocumentLayout, thd: bool,
                              positions: torch.Tensor | None = None):
    """The batch, the model's keyword arguments and the sparse head's positions for per-document attention
    (mlmclm.model.document_attention): TE layers take the rows end to end in the THD format, which re-indexes the
    positions (they index the sequence-major grid of the batch as made), local layers a block-diagonal mask."""
    if thd:
        flat = replace(batch, input_ids=rows_end_to_end(batch.input_ids), labels=rows_end_to_end(batch.labels),
                       loss_mask=rows_end_to_end(batch.loss_mask))
        if positions is not None:
            positions = positions_end_to_end(positions, *batch.input_ids.shape)
        return flat, {"packed_seq_params": packed_seq_params(layout)}, positions
    return batch, {"attention_mask": block_diagonal_mask(layout.document_ids, batch.causal)}, positions


def forward_backward(ddp_chunks, micro_batches: list[ObjectiveBatch], forward_only: bool = False,
                     sparse_head: bool = True, documents: list[DocumentLayout] | None = None,
                     predicted_positions: list[torch.Tensor] | None = None,
                     head_chunk_tokens: int = 0) -> torch.Tensor:
    """Run the schedule; return [loss_sum, predicted_tokens, correct] summed over the global batch, on every rank.

    `sparse_head`: for bidirectional (MLM) batches, run the output layer and CE at labelled positions only (same
    loss and gradients as the full head, fewer FLOPs). Causal (CLM) batches always use the full head.
    `predicted_positions`: the sparse head's positions, `flat_positions` of the loss masks, found on the host
    before the batch went to the device; None finds them here (one read of the masks from the device).
    `head_chunk_tokens`: run the output layer + CE over this many tokens at a time (mlmclm.model.chunked_head;
    same positions, same loss within float reassociation); 0 = megatron's own output layer and loss.
    `documents`: one layout per micro-batch for per-document attention; None attends across documents."""
    predicted = [None] * len(micro_batches)
    if sparse_head and not micro_batches[0].causal:
        predicted = predicted_positions
        if predicted is None:
            predicted = flat_positions([mb.loss_mask for mb in micro_batches])
    attention = [{} for _ in micro_batches]
    if documents is not None:
        thd = bool(getattr(unwrap(ddp_chunks[0]), "uses_transformer_engine", False))
        triples = [document_attention_inputs(mb, layout, thd, positions)
                   for mb, layout, positions in zip(micro_batches, documents, predicted)]
        micro_batches, attention, predicted = (list(t) for t in zip(*triples))
    seq = micro_batches[0].input_ids.shape[1]
    mbs = micro_batches[0].input_ids.shape[0]
    items = list(zip(micro_batches, predicted, attention))
    if len(ddp_chunks) > 1:
        # Interleaved schedule: one iterator per model chunk, each over the same micro-batches.
        iterators = [iter(items) for _ in ddp_chunks]
    else:
        iterators = iter(items)
    outputs = get_forward_backward_func()(
        forward_step_func=partial(_forward_step, head_chunk_tokens=head_chunk_tokens),
        data_iterator=iterators,
        model=ddp_chunks if len(ddp_chunks) > 1 else ddp_chunks[0],
        num_microbatches=len(micro_batches),
        seq_length=seq,
        micro_batch_size=mbs,
        forward_only=forward_only,
    )
    stats = torch.zeros(3, dtype=torch.float64, device=current_device())
    for out in outputs or []:
        stats += out["stats"].to(torch.float64)
    # Only the last pipeline stage computed the loss; sum over DP replicas, then share with the other stages.
    dist.all_reduce(stats, group=parallel_state.get_data_parallel_group())
    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        dist.all_reduce(stats, group=parallel_state.get_pipeline_model_parallel_group())
    return stats


def train_step(ddp_chunks, optimizer, scheduler, micro_batches: list[ObjectiveBatch],
               sparse_head: bool = True, documents: list[DocumentLayout] | None = None,
               predicted_positions: list[torch.Tensor] | None = None,
               stop_flag: Callable[[], torch.Tensor] | None = None, head_chunk_tokens: int = 0) -> StepResult:
    """One step, with one host read: the loss statistics, the squared gradient norm (the non-finite guard,
    `guarded_update`) and the agreed stop flag (`stop_flag()`, launched just before the read) come back together;
    the update is made only when the loss and the norm are finite."""
    for chunk in ddp_chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    stats = forward_backward(ddp_chunks, micro_batches, sparse_head=sparse_head, documents=documents,
                             predicted_positions=predicted_positions, head_chunk_tokens=head_chunk_tokens)
    prepare_main_grads(optimizer)
    read = [stats, squared_grad_norm(optimizer).to(stats.dtype).reshape(1)]
    if stop_flag is not None:
        read.append(stop_flag().to(stats.dtype).reshape(1))
    values = torch.cat(read).tolist()  # the step's one host synchronisation
    loss_sum, count, correct, norm_sq = values[:4]
    stop = bool(values[4]) if stop_flag is not None else False
    lr = optimizer.param_groups[0]["lr"]
    loss, accuracy = loss_sum / max(count, 1), correct / max(count, 1)
    # Every rank read the same numbers (reduced over the data-parallel, pipeline and grad-stats groups), so every
    # rank takes the same branch.
    if not (math.isfinite(loss_sum) and math.isfinite(norm_sq)):
        return StepResult(loss, accuracy, int(count), None, lr, skipped=True, stop_requested=stop)
    grad_norm = math.sqrt(norm_sq)
    clip_and_update(optimizer, grad_norm)
    scheduler.step(increment=1)
    return StepResult(loss, accuracy, int(count), grad_norm, lr, skipped=False, stop_requested=stop)
