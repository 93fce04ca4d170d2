"""Sparse prediction head: the output layer and the vocab-parallel cross entropy at labelled positions only.

MLM predicts a fraction of the positions (40 % in the paper), yet `GPTModel` runs its output layer and cross
entropy over all of them. `GPTModel.forward(..., output_processor=sparse_head_loss,
output_processor_context=positions)` hands us the final hidden states (after the final norm) on the last
pipeline stage instead; we keep only the rows at `positions` and run megatron's own output layer and loss on
them. Earlier stages never reach the processor, so the pipeline's p2p shapes (hidden states before the head)
are unchanged.

`positions` are flat indices into the sequence-major [s * b] grid of the whole micro-batch (`flat_positions`);
the labels passed with them are already selected, shaped [1, n] (megatron's [b, s] with b = 1).
"""
from __future__ import annotations

import torch
from megatron.core.tensor_parallel import gather_from_sequence_parallel_region


def flat_positions(loss_masks: list[torch.Tensor]) -> list[torch.Tensor]:
    """For each [b, s] loss mask, the indices of its labelled positions in the sequence-major [s * b] grid.

    The counts decide the head's shapes, so they are found on the host: masks already there (the training loop
    makes its batches on the host) cost no synchronisation; device masks are read back once for all micro-batches
    together, and the indices sent back without waiting."""
    if not loss_masks:
        return []
    device = loss_masks[0].device
    # Concatenated, not stacked: random-length micro-batches differ in length (mlmclm.data.random_length).
    sizes = [mask.numel() for mask in loss_masks]
    grid = torch.cat([mask.transpose(0, 1).reshape(-1) != 0 for mask in loss_masks]).cpu()  # [Σ s*b]
    counts = [int(part.sum()) for part in torch.split(grid, sizes)]
    starts = torch.tensor([0, *sizes[:-1]]).cumsum(0)
    nonzero = grid.nonzero().reshape(-1) - torch.repeat_interleave(starts, torch.tensor(counts))  # ascending each
    return list(torch.split(nonzero.to(device, non_blocking=True), counts))


def select_labels(labels: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[b, s] labels → the [1, n] labels at `positions` (same order as the gathered hidden states)."""
    return labels.transpose(0, 1).reshape(-1).index_select(0, positions).unsqueeze(0)


def sparse_head_loss(*, hidden_states, output_layer, output_weight, labels, context, compute_language_model_loss,
                     scale_logits, **_unused):
    """`GPTModel` output processor: per-position losses [1, n] at the `context` positions."""
    positions = context
    sequence_parallel = output_layer.sequence_parallel
    if sequence_parallel:
        # Gather the sequence shards here, as the output layer would. Its backward only splits: the output layer
        # below runs without SP and all-reduces its input gradient itself, so the sum happens exactly once.
        hidden_states = gather_from_sequence_parallel_region(
            hidden_states, tensor_parallel_output_grad=False, group=output_layer.tp_group)
    selected = hidden_states.reshape(-1, hidden_states.shape[-1]).index_select(0, positions).unsqueeze(1)
    # Without SP the column-parallel layer copies its input to the TP region (identity forward, all-reduce of
    # the input gradient backward): what the gathered-then-selected rows need. Megatron flips the flag the same
    # way for its last-token inference path.
    output_layer.sequence_parallel = False
    try:
        logits, _ = output_layer(selected, weight=output_weight)
    finally:
        output_layer.sequence_parallel = sequence_parallel
    return compute_language_model_loss(labels, scale_logits(logits))
