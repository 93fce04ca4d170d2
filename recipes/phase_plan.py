"""Beyond the paper: the phase plan production encoders train with, on the paper's CLM-first finding.

`clm_mlm_long_<size>`: CLM for half the steps (the paper: CLM first, then MLM), then MLM with the mask rate falling
linearly from 30 % to 15 % (Ankner et al. 2023; Ettin lowers 30 % → 15 % in its decay phase), then a short
long-context phase at 15 % on data of its own, at 8,192 tokens with RoPE θ raised from 10,000 to 160,000
(ModernBERT's long-context phase), which is also the WSD decay. Where each choice comes from is in
recipes/README.md ("Beyond the paper: the phase plan"). `tiny_phase_plan` (recipes/tiny.py) is its CPU twin.

What it does not do (refused or not implemented, so not pretended): per-phase batch sizes — the whole run takes
the micro batch that fits the long phase's samples; mixing random-length samples and prepared rows.
"""
from __future__ import annotations

import nemo_run as run

from recipes.base import (GPUS_PER_NODE, PAPER_DATA_PATH, PAPER_GLOBAL_BATCH, PAPER_RUN_ROOT, PAPER_SAMPLE_LENGTHS,
                          PAPER_TOTAL_STEPS, PAPER_WARMUP_STEPS, TOKENS_PER_GPU_FORWARD, Phase, paper_model,
                          train_partial)
from recipes.paper import PAPER_NODES

LONG_CONTEXT = 8192                 # ModernBERT's long-context phase
LONG_THETA = 160_000.0              # ModernBERT: RoPE θ 10,000 → 160,000 for it
LONG_DATA_PATH = "/data/fineweb-edu-llama3-8192"  # prepared at 8,192 tokens (tools/prepare_data.py --seq-length)
MASK_START, MASK_END = 0.3, 0.15    # Ankner et al. 2023 (linear 30 → 15 %); Ettin's decay phase (30 → 15 %)


def long_phase_micro_batch(long_context: int) -> int:
    """Samples per forward that keep the long phase's mean sample within the paper's tokens per GPU forward:
    per-phase micro batches are not implemented, so the whole run uses it (more accumulation, same samples)."""
    mean = (PAPER_SAMPLE_LENGTHS[0] + long_context) / 2
    return max(1, int(TOKENS_PER_GPU_FORWARD // mean))


def clm_mlm_long(size: str, total_steps: int = PAPER_TOTAL_STEPS, clm_share: float = 0.5, long_share: float = 0.05,
                 mask_start: float = MASK_START, mask_end: float = MASK_END, long_context: int = LONG_CONTEXT,
                 long_theta: float = LONG_THETA, nodes: int = PAPER_NODES, gpus_per_node: int = GPUS_PER_NODE,
                 data_path: str = PAPER_DATA_PATH, long_data_path: str = LONG_DATA_PATH, run_dir: str | None = None,
                 fp8: bool = True) -> run.Partial:
    """CLM (`clm_share`) → MLM `mask_start` → `mask_end` linear → long-context MLM at `mask_end` (`long_share`,
    `long_context` tokens, θ `long_theta`, its own data, the WSD decay); random-length samples throughout."""
    if not 0 < clm_share < 1 or not 0 < long_share < 1 or clm_share + long_share >= 1:
        raise ValueError(f"clm_share {clm_share} and long_share {long_share} must be in (0, 1) and leave steps for "
                         f"the MLM phase between them")
    clm_steps, long_steps = round(clm_share * total_steps), max(1, round(long_share * total_steps))
    phases = [Phase("clm", steps=clm_steps),
              Phase("mlm", steps=total_steps - clm_steps - long_steps, mask_ratio=mask_start,
                    mask_schedule="linear", mask_ratio_end=mask_end),
              Phase("mlm", steps=long_steps, mask_ratio=mask_end, name="mlm_long", rope_theta=long_theta,
                    max_position_embeddings=long_context, data_path=long_data_path,
                    random_length=(PAPER_SAMPLE_LENGTHS[0], long_context))]
    model, layout = paper_model(size)
    name = f"{size}-clm{clm_share:.0%}-mlm{mask_start:.0%}to{mask_end:.0%}-long{long_context}-{total_steps // 1000}k"
    return train_partial(
        model=model.with_overrides(max_position_embeddings=PAPER_SAMPLE_LENGTHS[1]), layout=layout, phases=phases,
        total_steps=total_steps, global_batch_size=PAPER_GLOBAL_BATCH, nodes=nodes, gpus_per_node=gpus_per_node,
        data_path=data_path, run_dir=run_dir or f"{PAPER_RUN_ROOT}/{name.replace('%', '')}",
        warmup_steps=PAPER_WARMUP_STEPS, decay_steps=long_steps, fp8=fp8,
        max_micro_batch=min(layout.max_micro_batch, long_phase_micro_batch(long_context)),
        random_length=PAPER_SAMPLE_LENGTHS)
