"""The held-out losses of a checkpoint without training it: the trainer's own validation (validation.py — the same
samples, masks and loss reduction as every evaluation of a run with this config) on weights loaded from any
checkpoint. What a continued-pretraining run reports for its step 0 (the imported model), which the training loop
never evaluates (it validates after steps)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from mlmclm.atomic_write import write_atomic
from mlmclm.model import build_model
from mlmclm.parallel import destroy_parallel, init_parallel
from mlmclm.parallel.launch import spawn
from mlmclm.train import checkpoint as ckpt
from mlmclm.train.config import TrainConfig
from mlmclm.train.optim import wrap_ddp
from mlmclm.train.phase_data import PhaseLoaders, padding
from mlmclm.train.resume_check import check_same_shape
from mlmclm.train.validation import Validator, validation_path


def held_out_losses(cfg: TrainConfig, checkpoint: str) -> dict[str, float]:
    """On the ranks of a torch.distributed job (torchrun or `spawn`): `cfg`'s validation of the weights of
    `checkpoint` (a run directory or an iter_* directory), as {"val/clm/loss": ..., "val/mlm/loss": ..., ...}."""
    state = init_parallel(cfg.parallel, seed=cfg.seed)
    try:
        # padded as the trainer pads random-length micro-batches: the same batches, the same loss
        padding_args = padding(cfg)
        loaders = PhaseLoaders(cfg, state.dp_rank, state.dp_size, **padding_args)
        try:
            manifest = loaders.manifest
        finally:
            loaders.close()
        path = validation_path(cfg, manifest)
        if path is None:
            raise ValueError(f"{cfg.data.path}: no validation split (prepare the data with --validation-every K, or "
                             f"set validation.path): there is no held-out loss to measure")
        validator = Validator(cfg, path, manifest.tokenizer, state.dp_rank, state.dp_size, state.device, **padding_args)
        source = ckpt.resolve_checkpoint(checkpoint)
        check_same_shape(ckpt.read_json(source, ckpt.RUN_CONFIG)["model"], cfg.model, str(source))
        chunks = build_model(cfg.model, cfg.parallel, cfg.precision, causal=False, use_te=cfg.use_te,
                             fused_kernels=cfg.fused_kernels, deterministic=cfg.deterministic,
                             packed_segments=cfg.packed_segments)
        ddp = wrap_ddp(chunks, cfg.optimizer.distributed_optimizer, False, False)
        ckpt.load_weights(source, ddp)
        return validator.evaluate(ddp, chunks, causal_now=False)
    finally:
        destroy_parallel()


def _worker(cfg: TrainConfig, checkpoint: str, out: str) -> None:
    losses = held_out_losses(cfg, checkpoint)
    if os.environ.get("RANK", "0") == "0":  # every rank holds the reduced losses; one writes them
        write_atomic(out, json.dumps(losses, indent=2, sort_keys=True) + "\n")


def measure_checkpoint(cfg: TrainConfig, checkpoint: str, out: Path, processes: int = 1) -> dict[str, float]:
    """`held_out_losses` on `processes` local processes (gloo on CPU, or one GPU each); the losses are also written
    to `out` (JSON)."""
    spawn(_worker, processes, cfg, str(checkpoint), str(out))
    return json.loads(Path(out).read_text(encoding="utf-8"))
