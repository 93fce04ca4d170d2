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
          validation_samples: int | None = None, max_positions: int | None = None) -> run.Partial:
    """Every tiny recipe: besides the shape, the pretraining seed (weights, data order, masks), the peak learning
    rate, the largest micro batch per process and the validation samples (default: one global batch)."""
    partial = train_partial(
        model=preset("tiny", **({} if max_positions is None else {"max_position_embeddings": max_positions})),
        layout=ParallelConfig(tensor_parallel=tensor_parallel), phases=phases,
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
                 lr: float = 1e-3, micro_batch: int = 2, validation_samples: int | None = None,
                 mask_schedule: str = "constant", mask_ratio_end: float | None = None) -> run.Partial:
    """CLM then MLM in one job (in-process switch) on CPU (the MLM rate may follow a `mask_schedule` from
    `mask_ratio` to `mask_ratio_end` over its phase); `nodes` > 1 spreads the processes over Slurm nodes
    (nodes × processes ranks, the same global batch). The decay defaults to half the MLM phase (the switch must
    precede it); the mini-replication gives every run of a budget the same decay, as the paper does."""
    phases = [Phase("clm", fraction=clm_share), Phase("mlm", fraction=1 - clm_share, mask_ratio=mask_ratio,
                                                      mask_schedule=mask_schedule, mask_ratio_end=mask_ratio_end)]
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


TINY_LONG_SEQ_LENGTH = 2 * TINY_SEQ_LENGTH  # the twin's long-context rows


def tiny_phase_plan(steps: int = 40, processes: int = 2, data_path: str = TINY_DATA_PATH,
                    long_data_path: str | None = None, run_dir: str | None = None, seed: int = 1234,
                    lr: float = 1e-3, micro_batch: int = 2) -> run.Partial:
    """The CPU twin of `clm_mlm_long_<size>` (recipes/phase_plan.py): CLM 50 %, MLM 30 % → 15 % linear, then a
    long-context MLM phase (10 %, at least 2 steps) at 15 % on rows of 256 tokens (`long_data_path`, default
    DATA_PATH_long) with the context raised from 128 to 256 and RoPE θ from 10,000 to 40,000, the WSD decay."""
    from recipes.phase_plan import MASK_END, MASK_START

    clm_steps, long_steps = round(steps * 0.5), max(2, round(steps * 0.1))
    if steps - clm_steps - long_steps < 1:
        raise ValueError(f"tiny_phase_plan needs steps >= 5 (CLM, MLM and the long phase), got {steps}")
    phases = [Phase("clm", steps=clm_steps),
              Phase("mlm", steps=steps - clm_steps - long_steps, mask_ratio=MASK_START, mask_schedule="linear",
                    mask_ratio_end=MASK_END),
              Phase("mlm", steps=long_steps, mask_ratio=MASK_END, name="mlm_long", rope_theta=40_000.0,
                    max_position_embeddings=TINY_LONG_SEQ_LENGTH, data_path=long_data_path or f"{data_path}_long")]
    return _tiny("tiny_phase_plan", phases, steps=steps, processes=processes, data_path=data_path, run_dir=run_dir,
                 warmup_steps=max(1, steps // 10), decay_steps=long_steps, seed=seed, lr=lr,
                 micro_batch=micro_batch, max_positions=TINY_SEQ_LENGTH)  # the long phase raises it


def prepare_tiny_phase_plan_data(data_path: str = TINY_DATA_PATH) -> Path:
    """The tiny data, and beside it (DATA_PATH_long) the same corpus packed at the long phase's 256 tokens."""
    prepare_tiny_data(data_path)
    prepare_tiny_data(f"{data_path}_long", seq_length=TINY_LONG_SEQ_LENGTH)
    return Path(data_path)


def prepare_tiny_data(data_path: str = TINY_DATA_PATH, max_tokens: int = TINY_MAX_TOKENS,
                      validation_every: int | None = None, seq_length: int = TINY_SEQ_LENGTH) -> Path:
    """The embedded demo corpus, packed for the tiny recipes (with `validation_every`, every K-th work held out as
    the validation split); reused when a manifest is already there.

    Only a missing or empty directory is written into: anything else without a manifest is someone's data."""
    from mlmclm.data.prepare import prepare_embedded_corpus

    path = Path(data_path)
    if not (path / "manifest.json").exists():
        if path.is_file() or (path.is_dir() and any(path.iterdir())):
            raise ValueError(f"{path} is not empty and not a dataset (no manifest.json): refusing to prepare the "
                             f"embedded corpus into it")
        prepare_embedded_corpus(path, seq_length=seq_length, max_tokens=max_tokens, progress=False,
                                validation_every=validation_every)
    return path
