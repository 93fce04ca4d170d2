"""Checkpoints: megatron dist_checkpointing (torch_dist), Megatron layout, atomic publication, safe loading.

Layout of a run's checkpoint directory:
    iter_0000100/                 dist_checkpointing shards (model + optimizer), reshardable to any TP/PP/DP
    iter_0000100/run_config.json  the full TrainConfig plus the tokenizer identity
    iter_0000100/train_state.json iteration, tokens, phase, loader and scheduler state (plain JSON)
    iter_0000100/rng/             per-rank generator states: torch, CUDA, megatron's tracker, random, numpy
                                  (restored only on the same layout; plain tensors and numbers, rng_state.py)
    latest_checkpointed_iteration.txt
A checkpoint is written under a temporary name and renamed when every rank has finished, then `latest` is
replaced atomically: a crash mid-save leaves the previous checkpoint as latest. Loading runs no code stored in a
checkpoint: tensors and byte items go through torch's weights-only loader, `.metadata` and TE's FP8 extra state
through an allow-list unpickler (`checkpoint_guard`), the rest is JSON.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing, parallel_state
from torch.distributed.checkpoint.api import CheckpointException

from mlmclm.atomic_write import write_atomic
from mlmclm.model.weights import unwrap
from mlmclm.parallel import current_device
from mlmclm.train import checkpoint_guard
from mlmclm.train import rng_state
from mlmclm.train import save_errors
from mlmclm.train import te_extra_state
from mlmclm.train.adam_step_state import fit_groups_to_fused_adam, keep_step_when_loading, keeps_step_per_parameter
from mlmclm.train.checkpoint_files import (  # noqa: F401  (the folder layout's names, for checkpoint's users)
    LATEST_FILE, RUN_CONFIG, TRAIN_STATE, CheckpointError, is_complete, iteration_dir, last_complete, latest_checkpoint,
    read_json, resolve_checkpoint)
from mlmclm.train.save_errors import CheckpointWriteError  # noqa: F401  (raised by save_checkpoint)

checkpoint_guard.install()

log = logging.getLogger(__name__)

_SHARDING = {"distrib_optim_sharding_type": "fully_reshardable"}


def model_sharded_state_dict(ddp_chunks) -> dict:
    if len(ddp_chunks) == 1:
        return {"model": unwrap(ddp_chunks[0]).sharded_state_dict(metadata=_SHARDING)}
    return {f"model{i}": unwrap(c).sharded_state_dict(metadata=_SHARDING) for i, c in enumerate(ddp_chunks)}


def _rank_tag() -> str:
    return (f"tp{parallel_state.get_tensor_model_parallel_rank()}_pp{parallel_state.get_pipeline_model_parallel_rank()}"
            f"_dp{parallel_state.get_data_parallel_rank()}")


def _current_layout() -> dict:
    return {"tp": parallel_state.get_tensor_model_parallel_world_size(),
            "pp": parallel_state.get_pipeline_model_parallel_world_size(),
            "dp": parallel_state.get_data_parallel_world_size()}


def _inner_optimizers(optimizer) -> list:
    """The megatron optimizers behind a (possibly chained) optimizer."""
    return getattr(optimizer, "chained_optimizers", [optimizer])


def _rng_state() -> dict:
    return rng_state.capture()


def _write_json_atomic(path: Path, data) -> None:
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True))   # an exclusive temporary file, then a rename


def save_sharded(sharded: dict, directory: str | Path) -> None:
    """`dist_checkpointing.save`, its write results kept in this process.

    megatron-core 0.19 writes a synchronous save with threads of the calling process and hands their results back
    through `filesystem_async._results_queue`, which it creates at the first save as `Manager().Queue()`: a spawned
    process per rank, alive for the rest of the run, that imports torch when the first results arrive (about 4 s of
    CPU and 800 MB resident per rank, measured on CPU) and sits in the rank's process group, where torchrun's
    forwarded SIGTERM/SIGUSR1 killed it and the save with it. Every save here is synchronous (there is no async
    save), so a thread-safe in-process queue is all the writer needs. Should a megatron version write from other
    processes, the save fails ("results_queue should not be empty"); it cannot lose results silently."""
    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if not isinstance(getattr(filesystem_async, "_results_queue", None), queue.Queue):
        filesystem_async._results_queue = queue.Queue()
    dist_checkpointing.save(sharded, str(directory))


def save_checkpoint(root: Path, iteration: int, ddp_chunks, optimizer, scheduler, train_state: dict,
                    run_config: dict, keep_last: int | None = None, keep: bool = False) -> Path:
    """Save on every rank; publish atomically. `keep` marks a checkpoint pruning never removes (phase ends)."""
    root = Path(root)
    final = iteration_dir(root, iteration)
    staging = root / f".staging_{final.name}"
    rank0 = dist.get_rank() == 0
    if rank0:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
    dist.barrier()
    sharded = model_sharded_state_dict(ddp_chunks)
    sharded["optimizer"] = optimizer.sharded_state_dict(sharded, is_loading=False, metadata=_SHARDING)

    def write_shards():
        save_sharded(sharded, staging)
        (staging / "rng").mkdir(exist_ok=True)
        torch.save(_rng_state(), staging / "rng" / f"{_rank_tag()}.pt")

    def publish():
        state = {**train_state, "scheduler": scheduler.state_dict(), "keep": keep,
                 "layout": _current_layout()}
        _write_json_atomic(staging / TRAIN_STATE, state)
        _write_json_atomic(staging / RUN_CONFIG, run_config)
        if final.exists():  # re-saving an iteration (e.g. after a resume): replace it
            shutil.rmtree(final)
        os.replace(staging, final)
        _write_json_atomic(root / LATEST_FILE, iteration)
        if keep_last:
            _prune(root, keep_last, protect=final)

    _agreed_write(write_shards, root, staging, iteration)
    _agreed_write(publish if rank0 else None, root, staging, iteration)
    return final


def _agreed_write(write, root: Path, staging: Path, iteration: int) -> None:
    """Run `write` (None: nothing on this rank); when it fails on any rank, every rank raises a
    CheckpointWriteError naming the OS's cause, after rank 0 removed the unfinished save (which frees its space, so
    the run's status can still be written). Without the agreement a rank whose write failed would leave the others
    waiting in the next barrier."""
    failure = None
    try:
        if write is not None:
            write()
    except (Exception, CheckpointException) as err:  # the filesystem's refusal, however megatron/DCP wrapped it
        failure = err  # (DCP's CheckpointException is a BaseException)
    flag = torch.tensor([int(failure is not None)], dtype=torch.int32, device=current_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if not flag.item():
        dist.barrier()
        return
    cause = save_errors.cause_of(failure, staging) if failure is not None else "another rank's write failed"
    last = last_complete(root)
    if dist.get_rank() == 0:
        shutil.rmtree(staging, ignore_errors=True)
    dist.barrier()
    message = save_errors.describe(root, iteration, cause, save_errors.tree_bytes(last) if last else None, last)
    raise CheckpointWriteError(message) from failure


def check_room(root: Path, iteration: int, last: Path | None) -> None:
    """Before a save, on every rank: stop with a CheckpointWriteError when rank 0 finds too little free space for
    another checkpoint of the last one's size (before anything is written; the decision is agreed by all ranks)."""
    error = None
    if dist.get_rank() == 0 and last is not None and Path(root).exists():
        error = save_errors.room_error(Path(root), iteration, save_errors.tree_bytes(last), last)
    flag = torch.tensor([int(error is not None)], dtype=torch.int32, device=current_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item():
        raise error or CheckpointWriteError(f"rank 0 found too little free space under {root} for checkpoint "
                                            f"iter_{iteration:07d}")


def _prune(root: Path, keep_last: int, protect: Path) -> None:
    periodic = []
    for path in sorted(root.glob("iter_*")):
        if path == protect or not is_complete(path):
            continue
        if not read_json(path, TRAIN_STATE).get("keep"):
            periodic.append(path)
    for path in periodic[: max(0, len(periodic) - (keep_last - 1))]:
        shutil.rmtree(path, ignore_errors=True)
        log.info("pruned checkpoint %s", path.name)


def load_weights(path: Path, ddp_chunks, optimizer=None) -> None:
    """Load model weights only (any layout, any spec → this one); with `optimizer` (continued pretraining), refresh
    its main parameters from them.

    The optimizer was built before the load; with bf16 parameters its fp32 main copy still holds the random init and
    would be copied back over the loaded weights at the first update. megatron's `reload_model_params` is the call
    Megatron-LM makes for a checkpoint loaded without its optimizer state.
    """
    sharded = model_sharded_state_dict(ddp_chunks)
    state = _load_strict(sharded, path, model_only=True)
    _apply_model_state(ddp_chunks, state)
    if optimizer is not None:
        optimizer.reload_model_params()


# Transformer Engine modules carry an `_extra_state` entry (FP8 scaling metadata). In megatron-core 0.19 the local
# linears store an empty one too, but TE's final norm adds one the local norm lacks, and TE attention has one in its
# state dict that megatron leaves out of dist checkpoints (tests/train/te_standin.py says how this was read). It is the
# only difference allowed between the keys a model asks for and the keys a checkpoint holds: a local-spec checkpoint
# loads into a TE model (whose FP8 metadata then starts fresh, as in a new run) and a TE checkpoint into a local model
# (the metadata is not used there). Every other missing or unexpected key is an error naming it.
EXTRA_STATE_SUFFIX = "_extra_state"


class CheckpointKeyError(CheckpointError):
    pass


def _is_extra_state(key: str) -> bool:
    return key.split("/")[0].endswith(EXTRA_STATE_SUFFIX)


def _load_strict(sharded: dict, path: Path, model_only: bool) -> dict:
    """dist_checkpointing.load, refusing any key mismatch except TE's `_extra_state` (both directions)."""
    from megatron.core.dist_checkpointing.validation import StrictHandling

    checkpoint_guard.check_checkpoint(path)
    state, in_checkpoint_only, requested_only = dist_checkpointing.load(
        sharded, str(path), strict=StrictHandling.RETURN_ALL)
    _make_extra_states_safe(state, path)
    # "missing" in megatron's terms: stored, not asked for. A weights-only load leaves the optimizer's out.
    not_loaded = sorted(k for k in in_checkpoint_only
                        if not _is_extra_state(k) and not (model_only and k.startswith("optimizer.")))
    not_found = sorted(k for k in requested_only if not _is_extra_state(k))
    if not_loaded or not_found:
        raise CheckpointKeyError(
            f"{path}: the checkpoint does not match this model: "
            + (f"missing from the checkpoint: {_preview(not_found)}; " if not_found else "")
            + (f"in the checkpoint but not in this model: {_preview(not_loaded)}" if not_loaded else ""))
    return state


def _make_extra_states_safe(state: dict, path: Path) -> None:
    """TE's `set_extra_state` unpickles what it is given: hand it only re-serialised, allow-listed FP8 metadata."""
    for model_key, model_state in state.items():
        if not model_key.startswith("model"):
            continue
        for key, value in model_state.items():
            if key.endswith(EXTRA_STATE_SUFFIX):
                model_state[key] = te_extra_state.safe_extra_state(value, f"{path}: {key}")


def _preview(keys: list[str], limit: int = 6) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" (+{len(keys) - limit} more)" if len(keys) > limit else "")


def _apply_model_state(ddp_chunks, state: dict) -> None:
    for index, chunk in enumerate(ddp_chunks):
        key = "model" if len(ddp_chunks) == 1 else f"model{index}"
        result = te_extra_state.load_vetted_state(unwrap(chunk), state[key])  # TE >= 2.18: see there
        missing = [k for k in result.missing_keys if not k.endswith(EXTRA_STATE_SUFFIX)]
        unexpected = [k for k in result.unexpected_keys if not k.endswith(EXTRA_STATE_SUFFIX)]
        if missing or unexpected:
            raise CheckpointKeyError(f"model chunk {index}: missing {_preview(missing)}; unexpected "
                                     f"{_preview(unexpected)}")


def load_full_state(path: Path, ddp_chunks, optimizer, scheduler) -> dict:
    """Resume: model, optimizer, scheduler and (same layout only) RNG states. Returns the saved train state."""
    sharded = model_sharded_state_dict(ddp_chunks)
    # A fresh optimizer has no Adam state yet; create it (zeros) so there are tensors to load into.
    for inner in _inner_optimizers(optimizer):
        inner.init_state_fn(inner.optimizer, inner.config)
        if keeps_step_per_parameter(inner.optimizer):
            # megatron's init leaves out torch Adam's per-parameter `step`; the loaded state overwrites it. (Not for
            # TE's FusedAdam: an H200 run found its state_dict raising KeyError 'step' on every resume.)
            for param_state in inner.optimizer.state.values():
                param_state.setdefault("step", torch.tensor(0.0))
            keep_step_when_loading(inner)
    sharded["optimizer"] = optimizer.sharded_state_dict(sharded, is_loading=True, metadata=_SHARDING)
    state = _load_strict(sharded, path, model_only=False)
    _apply_model_state(ddp_chunks, state)
    optimizer.load_state_dict(state["optimizer"])
    for inner in _inner_optimizers(optimizer):
        # megatron restores torch Adam's step as ONE tensor shared by every parameter; torch increments each
        # parameter's step in place, so a shared tensor would advance once per parameter. Give each its own.
        for param_state in inner.optimizer.state.values():
            if isinstance(param_state.get("step"), torch.Tensor):
                param_state["step"] = param_state["step"].clone()
        if not keeps_step_per_parameter(inner.optimizer):
            try:
                fit_groups_to_fused_adam(inner.optimizer)
            except ValueError as err:
                raise CheckpointError(f"{path}: {err}") from None
    train_state = read_json(path, TRAIN_STATE)
    scheduler.load_state_dict(train_state["scheduler"])
    rng_file = Path(path) / "rng" / f"{_rank_tag()}.pt"
    layout = train_state.get("layout", {})
    if layout == _current_layout() and rng_file.exists():
        rng_state.restore(torch.load(rng_file, weights_only=True))
    else:
        log.info("checkpoint saved at layout %s: RNG states not restored on this layout", layout)
    return train_state
