"""The paper's experiments as recipe builders: MLM, CLM, CLM→MLM (biphasic) and continued MLM pretraining.

Each is `train_partial` (recipes.base) with the experiment's phases and schedule; sizes come from `base.SIZES`.
Every recipe trains the paper's random-length samples (12-2048 tokens, attention within each sample, 12 per GPU
forward); `fixed_rows=True` trains the prepared 2048-token rows instead (6 per forward, attention over the row).
Run names follow the released models' naming (the MLMvsCLM model cards): `610m-mlm40-42k`, `610m-clm-42k`,
`610m-clm-10k-mlm40-42k` (CLM steps, then MLM at 40 % up to 42k in all), `610m-clm-dec42k-mlm40-44k` (MLM
continued from the *decayed* CLM-42k checkpoint for 2k more steps). Which of these the paper trained is the grid in
`recipes/sweep.py`; where each setting comes from is in recipes/README.md ("Where each setting comes from").
"""
from __future__ import annotations

import re
from pathlib import PurePosixPath

import nemo_run as run

from recipes.base import (GPUS_PER_NODE, PAPER_DATA_PATH, PAPER_DECAY_STEPS, PAPER_GLOBAL_BATCH, PAPER_GPUS,
                          PAPER_RUN_ROOT, PAPER_SAMPLE_LENGTHS, PAPER_SEQ_LENGTH, PAPER_SEQS_PER_GPU,
                          PAPER_TOTAL_STEPS, PAPER_WARMUP_STEPS, TOKENS_PER_GPU_FORWARD, Phase, paper_model,
                          train_partial)

SEQ_LENGTH = PAPER_SEQ_LENGTH  # 2048 (recipes/base.py says where it comes from)
DATA_PATH = PAPER_DATA_PATH
# Per GPU forward: the paper's 12 random-length samples (12 × 1030 tokens on average, the memory budget of
# base.SIZES), or 6 fixed rows of 2048 (`fixed_rows=True`).
MAX_MICRO_BATCH = PAPER_SEQS_PER_GPU
MAX_MICRO_BATCH_FIXED_ROWS = TOKENS_PER_GPU_FORWARD // SEQ_LENGTH

MASK_RATIOS = (0.2, 0.3, 0.4, 0.5)
BUDGETS = (12_000, 22_000, 42_000)
# Biphasic CLM steps per budget, in whole thousands as the released model names have them (25/50/75 % of the
# budget, rounded by the authors: 22k gives 5k/11k/17k, 42k gives 10k/21k/32k).
BIPHASIC_CLM_STEPS = {12_000: (3_000, 6_000, 9_000), 22_000: (5_000, 11_000, 17_000),
                      42_000: (10_000, 21_000, 32_000)}
CLM_SHARES = (0.25, 0.5, 0.75)
ABLATION_CLM_STEPS = 40_000  # the mask-ratio ablation: CLM 40k then MLM 2k (20/30/40/50 %) = 42k
CPT_STEPS = (2_000, 12_000, 22_000)
PAPER_NODES = PAPER_GPUS // GPUS_PER_NODE  # 24 nodes of 8 GPUs


def steps_label(steps: int) -> str:
    """42000 -> '42k', 31500 -> '31.5k' (the released names use whole thousands)."""
    return f"{steps // 1000}k" if steps % 1000 == 0 else f"{steps / 1000:g}k"


def mask_label(mask_ratio: float) -> str:
    return f"mlm{round(mask_ratio * 100)}"


def mlm_name(size: str, mask_ratio: float, steps: int) -> str:
    return f"{size}-{mask_label(mask_ratio)}-{steps_label(steps)}"


def clm_name(size: str, steps: int) -> str:
    return f"{size}-clm-{steps_label(steps)}"


def biphasic_name(size: str, clm_steps: int, mask_ratio: float, total_steps: int) -> str:
    return f"{size}-clm-{steps_label(clm_steps)}-{mask_label(mask_ratio)}-{steps_label(total_steps)}"


_SINGLE_STAGE = re.compile(r"^(?P<size>[0-9.]+[mb])-(?P<objective>clm|mlm\d+)-(?P<steps>\d+(?:\.\d+)?)k$")


def cpt_name(size: str, parent: str | None, steps: int, mask_ratio: float) -> str:
    """`610m-clm-dec42k-mlm40-44k` for MLM continued from the decayed `610m-clm-42k`; a parent whose name does not
    follow the single-stage pattern (e.g. a converted HF model) gives `610m-cpt-<parent>-mlm40-2k`."""
    match = _SINGLE_STAGE.match(PurePosixPath(parent).name) if parent else None
    if match is None:
        origin = PurePosixPath(parent).name if parent else "init"
        return f"{size}-cpt-{origin}-{mask_label(mask_ratio)}-{steps_label(steps)}"
    parent_steps = round(float(match["steps"]) * 1000)
    return (f"{match['size']}-{match['objective']}-dec{steps_label(parent_steps)}-{mask_label(mask_ratio)}-"
            f"{steps_label(parent_steps + steps)}")


def _paper(size: str, run_name: str, phases: list[Phase], *, total_steps: int, nodes: int, gpus_per_node: int,
           data_path: str, run_dir: str | None, fp8: bool, fixed_rows: bool,
           warmup_steps: int = PAPER_WARMUP_STEPS, decay_steps: int = PAPER_DECAY_STEPS,
           init_from: str | None = None) -> run.Partial:
    model, layout = paper_model(size)
    return train_partial(
        model=model.with_overrides(max_position_embeddings=SEQ_LENGTH), layout=layout, phases=phases,
        total_steps=total_steps, global_batch_size=PAPER_GLOBAL_BATCH, nodes=nodes, gpus_per_node=gpus_per_node,
        data_path=data_path, run_dir=run_dir or f"{PAPER_RUN_ROOT}/{run_name}", warmup_steps=warmup_steps,
        decay_steps=decay_steps, init_from=init_from, fp8=fp8,
        max_micro_batch=min(layout.max_micro_batch, MAX_MICRO_BATCH_FIXED_ROWS if fixed_rows else MAX_MICRO_BATCH),
        random_length=None if fixed_rows else PAPER_SAMPLE_LENGTHS,
        # Data must come from the paper's Llama-3 tokenizer (vocab 128256); the manifest records it, and the
        # trainer checks it against the checkpoint on resume, so no hub download is needed on compute nodes.
        tokenizer=None)


def mlm(size: str, mask_ratio: float = 0.4, total_steps: int = PAPER_TOTAL_STEPS, nodes: int = PAPER_NODES,
        gpus_per_node: int = GPUS_PER_NODE, data_path: str = DATA_PATH, run_dir: str | None = None,
        fp8: bool = True, fixed_rows: bool = False) -> run.Partial:
    """MLM from scratch, mask-token-only masking at `mask_ratio`."""
    return _paper(size, mlm_name(size, mask_ratio, total_steps), [Phase("mlm", fraction=1.0, mask_ratio=mask_ratio)],
                  total_steps=total_steps, nodes=nodes, gpus_per_node=gpus_per_node, data_path=data_path,
                  run_dir=run_dir, fp8=fp8, fixed_rows=fixed_rows)


def clm(size: str, total_steps: int = PAPER_TOTAL_STEPS, nodes: int = PAPER_NODES,
        gpus_per_node: int = GPUS_PER_NODE, data_path: str = DATA_PATH, run_dir: str | None = None,
        fp8: bool = True, fixed_rows: bool = False) -> run.Partial:
    """CLM from scratch (causal attention); its final (decayed) checkpoint feeds `cpt_*`."""
    return _paper(size, clm_name(size, total_steps), [Phase("clm", fraction=1.0)], total_steps=total_steps,
                  nodes=nodes, gpus_per_node=gpus_per_node, data_path=data_path, run_dir=run_dir, fp8=fp8,
                  fixed_rows=fixed_rows)


def biphasic_clm_steps(total_steps: int, clm_steps: int | None, clm_share: float | None) -> int:
    """The CLM steps of a biphasic run: explicit `clm_steps`, else `clm_share` of the budget — the paper's whole
    thousands at its budgets and shares (22k × 25 % = 5k, not 5.5k), the exact rounded product elsewhere."""
    if clm_steps is not None and clm_share is not None:
        raise ValueError("give clm_steps or clm_share, not both")
    if clm_steps is None:
        share = 0.25 if clm_share is None else clm_share
        if not 0 < share < 1:
            raise ValueError(f"clm_share must be strictly between 0 and 1, got {share}")
        if total_steps in BIPHASIC_CLM_STEPS and share in CLM_SHARES:
            clm_steps = BIPHASIC_CLM_STEPS[total_steps][CLM_SHARES.index(share)]
        else:
            clm_steps = round(share * total_steps)
    if not 0 < clm_steps < total_steps:
        raise ValueError(f"clm_steps must be between 1 and total_steps - 1 ({total_steps - 1}), got {clm_steps}")
    return clm_steps


def clm_mlm(size: str, clm_steps: int | None = None, clm_share: float | None = None,
            total_steps: int = PAPER_TOTAL_STEPS, mask_ratio: float = 0.4, nodes: int = PAPER_NODES,
            gpus_per_node: int = GPUS_PER_NODE, data_path: str = DATA_PATH, run_dir: str | None = None,
            fp8: bool = True, fixed_rows: bool = False) -> run.Partial:
    """Biphasic: CLM for `clm_steps` (or `clm_share` of the budget; default 25 %), then MLM, in one job (one WSD
    schedule, in-process switch). The switch comes before the WSD decay: validation refuses a decay longer than
    the MLM phase."""
    clm_steps = biphasic_clm_steps(total_steps, clm_steps, clm_share)
    phases = [Phase("clm", steps=clm_steps), Phase("mlm", steps=total_steps - clm_steps, mask_ratio=mask_ratio)]
    return _paper(size, biphasic_name(size, clm_steps, mask_ratio, total_steps), phases, total_steps=total_steps,
                  nodes=nodes, gpus_per_node=gpus_per_node, data_path=data_path, run_dir=run_dir, fp8=fp8,
                  fixed_rows=fixed_rows)


def cpt_schedule(steps: int) -> tuple[int, int]:
    """Warmup and decay for continued pretraining (our choice, not the paper's): a fresh optimizer needs a
    re-warmup (10 % of the run, at most the paper's 2k), and the run ends with the paper's 2k linear decay
    (shortened to what is left after warmup for short runs)."""
    warmup = min(PAPER_WARMUP_STEPS, steps // 10)
    return warmup, min(PAPER_DECAY_STEPS, steps - warmup)


def cpt(size: str, init_from: str | None = None, steps: int = 2_000, mask_ratio: float = 0.4,
        nodes: int = PAPER_NODES, gpus_per_node: int = GPUS_PER_NODE, data_path: str = DATA_PATH,
        run_dir: str | None = None, fp8: bool = True, fixed_rows: bool = False) -> run.Partial:
    """Continued MLM pretraining from `init_from`: a run dir, checkpoints dir or iter_* dir of ours, or one
    converted from Hugging Face weights into our checkpoint format. Weights only; optimizer, schedule and data
    position start fresh. The paper continues the decayed (final) CLM-42k and MLM-42k checkpoints."""
    if not init_from:
        raise ValueError("cpt needs init_from=<run dir | checkpoints dir | iter_* dir> (the checkpoint to continue)")
    warmup, decay = cpt_schedule(steps)
    return _paper(size, cpt_name(size, init_from, steps, mask_ratio),
                  [Phase("mlm", fraction=1.0, mask_ratio=mask_ratio)], total_steps=steps, nodes=nodes,
                  gpus_per_node=gpus_per_node, data_path=data_path, run_dir=run_dir, fp8=fp8,
                  fixed_rows=fixed_rows, warmup_steps=warmup, decay_steps=decay, init_from=init_from)
