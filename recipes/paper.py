"""The paper's experiments as recipe builders: MLM, CLM, CLM→MLM (biphasic) and continued MLM pretraining.

Each is `train_partial` (recipes.base) with the experiment's phases and schedule; sizes come from `base.SIZES`.
Defaults reproduce the paper: 42k steps, 2304 × 1024 tokens per step, WSD with 2k warmup and 2k linear decay.
"""
from __future__ import annotations

import nemo_run as run

from recipes.base import (GPUS_PER_NODE, PAPER_DATA_PATH, PAPER_DECAY_STEPS, PAPER_GLOBAL_BATCH, PAPER_GPUS,
                          PAPER_RUN_ROOT, PAPER_TOTAL_STEPS, PAPER_WARMUP_STEPS, Phase, paper_model, train_partial)

MASK_RATIOS = (0.2, 0.3, 0.4, 0.5)
CLM_SHARES = (0.25, 0.5, 0.75)
BIPHASIC_BUDGETS = (12_000, 22_000, 42_000)
CPT_STEPS = (2_000, 12_000, 22_000)
PAPER_NODES = PAPER_GPUS // GPUS_PER_NODE  # 24 nodes of 8 GPUs: one micro batch of 12 per GPU, no accumulation


def _paper(size: str, run_name: str, phases: list[Phase], *, total_steps: int, nodes: int, gpus_per_node: int,
           data_path: str, run_dir: str | None, fp8: bool, warmup_steps: int = PAPER_WARMUP_STEPS,
           decay_steps: int = PAPER_DECAY_STEPS, init_from: str | None = None) -> run.Partial:
    model, layout = paper_model(size)
    return train_partial(
        model=model, layout=layout, phases=phases, total_steps=total_steps, global_batch_size=PAPER_GLOBAL_BATCH,
        nodes=nodes, gpus_per_node=gpus_per_node, data_path=data_path,
        run_dir=run_dir or f"{PAPER_RUN_ROOT}/{run_name}", warmup_steps=warmup_steps, decay_steps=decay_steps,
        init_from=init_from, fp8=fp8, max_micro_batch=layout.max_micro_batch,
        # Data must come from the paper's Llama-3 tokenizer (vocab 128256); the manifest records it, and the
        # trainer checks it against the checkpoint on resume, so no hub download is needed on compute nodes.
        tokenizer=None)


def mlm(size: str, mask_ratio: float = 0.4, total_steps: int = PAPER_TOTAL_STEPS, nodes: int = PAPER_NODES,
        gpus_per_node: int = GPUS_PER_NODE, data_path: str = PAPER_DATA_PATH, run_dir: str | None = None,
        fp8: bool = True) -> run.Partial:
    """MLM from scratch, mask-token-only masking at `mask_ratio`."""
    name = f"mlm_{size}-m{round(mask_ratio * 100)}-{total_steps // 1000}k"
    return _paper(size, name, [Phase("mlm", fraction=1.0, mask_ratio=mask_ratio)], total_steps=total_steps,
                  nodes=nodes, gpus_per_node=gpus_per_node, data_path=data_path, run_dir=run_dir, fp8=fp8)


def clm(size: str, total_steps: int = PAPER_TOTAL_STEPS, nodes: int = PAPER_NODES,
        gpus_per_node: int = GPUS_PER_NODE, data_path: str = PAPER_DATA_PATH, run_dir: str | None = None,
        fp8: bool = True) -> run.Partial:
    """CLM from scratch (causal attention); its checkpoints feed `cpt_*` and the two-task chain."""
    name = f"clm_{size}-{total_steps // 1000}k"
    return _paper(size, name, [Phase("clm", fraction=1.0)], total_steps=total_steps, nodes=nodes,
                  gpus_per_node=gpus_per_node, data_path=data_path, run_dir=run_dir, fp8=fp8)


def clm_mlm(size: str, clm_share: float = 0.25, total_steps: int = PAPER_TOTAL_STEPS, mask_ratio: float = 0.4,
            nodes: int = PAPER_NODES, gpus_per_node: int = GPUS_PER_NODE, data_path: str = PAPER_DATA_PATH,
            run_dir: str | None = None, fp8: bool = True) -> run.Partial:
    """Biphasic: CLM for `clm_share` of the budget, then MLM, in one job (one schedule, in-process switch).

    The switch comes before the WSD decay: validation refuses a decay longer than the MLM phase.
    """
    if not 0 < clm_share < 1:
        raise ValueError(f"clm_share must be strictly between 0 and 1, got {clm_share}")
    name = f"clm_mlm_{size}-clm{round(clm_share * 100)}-{total_steps // 1000}k"
    phases = [Phase("clm", fraction=clm_share), Phase("mlm", fraction=1 - clm_share, mask_ratio=mask_ratio)]
    return _paper(size, name, phases, total_steps=total_steps, nodes=nodes, gpus_per_node=gpus_per_node,
                  data_path=data_path, run_dir=run_dir, fp8=fp8)


def cpt_schedule(steps: int) -> tuple[int, int]:
    """Warmup and decay for continued pretraining (our choice, not the paper's): a fresh optimizer needs a
    re-warmup (10 % of the run, at most the paper's 2k), and the run ends with the paper's 2k linear decay
    (shortened to what is left after warmup for short runs)."""
    warmup = min(PAPER_WARMUP_STEPS, steps // 10)
    return warmup, min(PAPER_DECAY_STEPS, steps - warmup)


def cpt(size: str, init_from: str | None = None, steps: int = 2_000, mask_ratio: float = 0.4,
        nodes: int = PAPER_NODES, gpus_per_node: int = GPUS_PER_NODE, data_path: str = PAPER_DATA_PATH,
        run_dir: str | None = None, fp8: bool = True) -> run.Partial:
    """Continued MLM pretraining from `init_from`: a run dir, checkpoints dir or iter_* dir of ours, or one
    converted from Hugging Face weights into our checkpoint format. Weights only; optimizer, schedule and data
    position start fresh."""
    if not init_from:
        raise ValueError("cpt needs init_from=<run dir | checkpoints dir | iter_* dir> (the checkpoint to continue)")
    warmup, decay = cpt_schedule(steps)
    name = f"cpt_{size}-m{round(mask_ratio * 100)}-{steps // 1000}k"
    return _paper(size, name, [Phase("mlm", fraction=1.0, mask_ratio=mask_ratio)], total_steps=steps,
                  nodes=nodes, gpus_per_node=gpus_per_node, data_path=data_path, run_dir=run_dir, fp8=fp8,
                  warmup_steps=warmup, decay_steps=decay, init_from=init_from)
