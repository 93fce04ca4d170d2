"""Move full (unsharded, global-layer-numbered) weights in and out of this rank's model chunks."""
from __future__ import annotations

import re
from typing import Callable

import torch
import torch.distributed as dist
from megatron.core import parallel_state

from mlmclm.model.architectures import TIED_COPIES, split_of
from mlmclm.model.hf_mapping import from_te_name, shard, unshard

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


def unwrap(chunk: torch.nn.Module) -> torch.nn.Module:
    """The GPTModel inside megatron's DDP / Float16 wrappers."""
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def _global_name(model: torch.nn.Module, local_name: str) -> str:
    match = _LAYER.match(local_name)
    if not match:
        return from_te_name(local_name)
    layer = model.decoder.layers[int(match.group(1))]
    return from_te_name(_LAYER.sub(f"decoder.layers.{layer.layer_number - 1}.", local_name, count=1))


def named_parameters_global(chunks) -> list[tuple[str, torch.nn.Parameter]]:
    """(full-model name, local parameter) for every parameter this rank holds."""
    out = []
    for chunk in chunks:
        model = unwrap(chunk)
        for name, param in model.named_parameters():
            out.append((_global_name(model, name), param))
    return out


@torch.no_grad()
def load_full_weights(chunks, get_full: Callable[[str], torch.Tensor]) -> None:
    """Copy this rank's TP slice of each full tensor (looked up by full-model name) into the chunks. A tied copy
    (ModernBERT's decoder weight, held apart on a last pipeline stage) is looked up as the tensor it copies."""
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tied = any(getattr(unwrap(chunk), "share_embeddings_and_output_weights", False) for chunk in chunks)
    for name, param in named_parameters_global(chunks):
        full = get_full(TIED_COPIES.get(name, name) if tied else name)
        piece = shard(full, split_of(name), tp_size, tp_rank)
        if piece.shape != param.shape:
            raise ValueError(f"{name}: expected a TP slice of shape {tuple(param.shape)}, got {tuple(piece.shape)}")
        param.copy_(piece.to(param.dtype))


def gather_full(chunks, what: str = "weight") -> dict[str, torch.Tensor]:
    """Every full tensor of the model on every rank (small models only: tests, parity checks).

    `what` is "weight" or "grad" (megatron DDP keeps gradients in `main_grad`).
    """
    mine: dict[str, torch.Tensor] = {}
    for name, param in named_parameters_global(chunks):
        if what == "weight":
            tensor = param.detach()
        else:
            tensor = getattr(param, "main_grad", None)
            tensor = param.grad if tensor is None else tensor
            if tensor is None:
                raise ValueError(f"{name} has no gradient")
        mine[name] = tensor.detach().float().cpu().clone()
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return mine
    # TP slices of the same name are joined in TP-rank order; PP stages contribute disjoint names.
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (parallel_state.get_data_parallel_rank(), tp_rank, mine))
    slices: dict[str, dict[int, torch.Tensor]] = {}
    for dp_rank, rank_tp, tensors in gathered:
        if dp_rank != 0:
            continue
        for name, tensor in tensors.items():
            slices.setdefault(name, {})[rank_tp] = tensor
    return {name: unshard([by_rank[r] for r in sorted(by_rank)], split_of(name)) for name, by_rank in slices.items()}
