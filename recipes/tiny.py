"""Tiny CPU recipes (what `make demo`-sized runs use): the `tiny` preset, the embedded corpus, 2 processes.

Same base as the paper recipes; only the shape, data, batch and schedule lengths are scaled down.
"""
from __future__ import annotations

from pathlib import Path

import nemo_run as run

from mlmclm.model.config import preset
from mlmclm.parallel.runtime import ParallelConfig
from recipes.base import Phase, train_partial

TINY_DATA_PATH = "runs/demo_data"
TINY_RUN_ROOT = "runs/recipes"
TINY_SEQ_LENGTH = 128
TINY_MAX_TOKENS = 300_000  # enough packed sequences for a few hundred tiny steps; prepares in seconds


def _tiny(run_name: str, phases: list[Phase], *, steps: int, processes: int, data_path: str, run_dir: str | None,
          warmup_steps: int, decay_steps: int, init_from: str | None = None,
          tensor_parallel: int = 1, nodes: int = 1, seed: int = 1234, lr: float = 1e-3, micro_batch: int = 2,
          validation_samples: int | None = None) -> run.Partial:
    """Every tiny recipe: besides the shape, the pretraining seed (weights, data order, masks), the peak learning
    rate, the largest micro batch per process and the validation samples (default: one global batch)."""
    partial = train_partial(
        model=preset("tiny"), layout=ParallelConfig(tensor_parallel=tensor_parallel), phases=phases,
        total_steps=steps, global_batch_size=8, nodes=nodes, gpus_per_node=processes, data_path=data_path,
        run_dir=run_dir or f"{TINY_RUN_ROOT}/{run_name}", tokenizer="embedded", warmup_steps=warmup_steps,
        decay_steps=decay_steps, lr=lr, init_from=init_from, fp8=False, max_micro_batch=micro_batch,
        save_interval=max(1, steps // 2), log_interval=2, validation_interval=max(1, steps // 16), seed=seed)
    if validation_samples is not None:  # more held-out samples than one global batch: a steadier validation loss
        partial.config.validation.samples = validation_samples
    return partial


def tiny_clm_mlm(steps: int = 20, clm_share: float = 0.25, mask_ratio: float = 0.4, processes: int = 2,
                 data_path: str = TINY_DATA_PATH, run_dir: str | None = None,
                 tensor_parallel: int = 1, nodes: int = 1, decay_steps: int | None = None, seed: int = 1234,
                 lr: float = 1e-3, micro_batch: int = 2, validation_samples: int | None = None) -> run.Partial:
    """CLM then MLM in one job (in-process switch) on CPU; `nodes` > 1 spreads the processes over Slurm nodes
    (nodes × processes ranks, the same global batch). The decay defaults to half the MLM phase (the switch must
    precede it); the mini-replication gives every run of a budget the same decay, as the paper does."""
    phases = [Phase("clm", fraction=clm_share), Phase("mlm", fraction=1 - clm_share, mask_ratio=mask_ratio)]
    decay = decay_steps if decay_steps is not None else max(1, round(steps * (1 - clm_share)) // 2)
    return _tiny("tiny_clm_mlm", phases, steps=steps, processes=processes, data_path=data_path, run_dir=run_dir,
                 warmup_steps=max(1, steps // 10), decay_steps=decay, tensor_parallel=tensor_parallel, nodes=nodes,
                 seed=seed, lr=lr, micro_batch=micro_batch, validation_samples=validation_samples)


def tiny_clm(steps: int = 20, processes: int = 2, data_path: str = TINY_DATA_PATH,
             run_dir: str | None = None, seed: int = 1234, lr: float = 1e-3, micro_batch: int = 2,
             validation_samples: int | None = None) -> run.Partial:
    return _tiny("tiny_clm", [Phase("clm", fraction=1.0)], steps=steps, processes=processes, data_path=data_path,
                 run_dir=run_dir, warmup_steps=max(1, steps // 10), decay_steps=max(1, steps // 5), seed=seed,
                 lr=lr, micro_batch=micro_batch, validation_samples=validation_samples)


def tiny_mlm(steps: int = 20, mask_ratio: float = 0.4, processes: int = 2, data_path: str = TINY_DATA_PATH,
             run_dir: str | None = None, init_from: str | None = None, seed: int = 1234, lr: float = 1e-3,
             micro_batch: int = 2, validation_samples: int | None = None) -> run.Partial:
    """MLM on CPU; with `init_from` it is the continued-pretraining (CPT) variant."""
    return _tiny("tiny_cpt" if init_from else "tiny_mlm", [Phase("mlm", fraction=1.0, mask_ratio=mask_ratio)],
                 steps=steps, processes=processes, data_path=data_path, run_dir=run_dir,
                 warmup_steps=max(1, steps // 10), decay_steps=max(1, steps // 5), init_from=init_from, seed=seed,
                 lr=lr, micro_batch=micro_batch, validation_samples=validation_samples)


def prepare_tiny_data(data_path: str = TINY_DATA_PATH, max_tokens: int = TINY_MAX_TOKENS,
                      validation_every: int | None = None) -> Path:
    """The embedded demo corpus, packed for the tiny recipes (with `validation_every`, every K-th work held out as
    the validation split); reused when a manifest is already there.

    Only a missing or empty directory is written into: anything else without a manifest is someone's data."""
    from mlmclm.data.prepare import prepare_embedded_corpus

    path = Path(data_path)
    if not (path / "manifest.json").exists():
        if path.is_file() or (path.is_dir() and any(path.iterdir())):
            raise ValueError(f"{path} is not empty and not a dataset (no manifest.json): refusing to prepare the "
                             f"embedded corpus into it")
        prepare_embedded_corpus(path, seq_length=TINY_SEQ_LENGTH, max_tokens=max_tokens, progress=False,
                                validation_every=validation_every)
    return path
