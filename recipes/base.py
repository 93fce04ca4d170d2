"""The one common recipe base: a `run.Partial(pretrain_entry, config=run.Config(TrainConfig, ...))` builder,
the paper's defaults, the per-size H100 layouts, batch sizing for a fixed global batch, and recipe validation.

Every registered recipe (paper sizes and the tiny CPU ones) is this builder with different arguments.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import fiddle as fdl
import nemo_run as run

from mlmclm.data.random_length import SampleLengths
from mlmclm.model.config import ModelConfig, preset
from mlmclm.model.precision import PrecisionConfig
from mlmclm.objectives import ObjectiveConfig
from mlmclm.parallel.runtime import ParallelConfig
from mlmclm.train.config import CheckpointConfig, DataConfig, LoggingConfig, PhaseConfig, TrainConfig, ValidationConfig
from mlmclm.train.optim_config import OptimizerConfig, ScheduleConfig
from recipes.entry import pretrain_entry

# --- the paper's setup --------------------------------------------------------------------------------------
# Released configs (MLMvsCLM/*/config.json) have max_position_embeddings 2048 and the authors' Optimus trainer
# defaults to 2048-token sequences: the paper recipes train and export at 2048 (set when the data is prepared).
PAPER_SEQ_LENGTH = 2048
# Memory budget per GPU and forward, in tokens: SIZES' layouts were sized for 12 sequences of 1024 (6 of 2048).
TOKENS_PER_GPU_FORWARD = 12 * 1024
PAPER_GPUS, PAPER_SEQS_PER_GPU = 192, 12
PAPER_GLOBAL_BATCH = PAPER_GPUS * PAPER_SEQS_PER_GPU  # 2304 samples per step
# The paper's samples: lengths uniform in [12, 2048] (the authors' Optimus packs with `--random_size`), 1030
# tokens on average, so 2304 × 1030 = 2 373 120 tokens per step (the paper's figure) and ≈ 99.7B per 42k run.
PAPER_SAMPLE_LENGTHS = (12, 2048)
PAPER_TOTAL_STEPS = 42_000
PAPER_WARMUP_STEPS = 2_000
PAPER_DECAY_STEPS = 2_000  # WSD: linear decay over the last 2k steps
PAPER_DATA_PATH = "/data/fineweb-edu-llama3-2048"  # container path; the Slurm executor mounts data at /data
PAPER_RUN_ROOT = "/checkpoints/mlmclm"  # container path; the Slurm executor mounts checkpoints at /checkpoints
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class SizeLayout:
    """How one paper size is split on 8×H100 (80 GB) nodes."""

    preset: str
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    virtual_pipeline_parallel: int | None = None
    context_parallel: int = 1
    sequence_parallel: bool = False
    distributed_optimizer: bool = True
    max_micro_batch: int = PAPER_SEQS_PER_GPU  # sequences per GPU per forward; accumulation covers the rest

    def parallel(self) -> ParallelConfig:
        return ParallelConfig(self.tensor_parallel, self.pipeline_parallel, self.virtual_pipeline_parallel,
                              self.context_parallel, self.sequence_parallel)


# Memory: the comments below size each layout for the mean micro-batch; `python -m recipes.sweep paper --plan`
# prints the estimate at the mean and at the worst (24,576 tokens) and refuses a layout that cannot fit an 80 GB
# H100 there (mlmclm/model/memory.py).
# FP8 (hybrid E4M3/E5M2 GEMMs through TE) is on for every size; FP8 *attention* stays "auto", which
# `mlmclm.model.precision.fp8_attention_decision` turns off for these runs (random-length samples run attention
# as packed THD, which TE's FP8 attention never takes; head_dim 64 and 96 would need 128 on Hopper anyway), so
# attention runs in bf16 and logs why.
SIZES: dict[str, SizeLayout] = {
    # 210m (head_dim 64): weights + Adam state are ~3 GB, so pure data parallelism is fastest; TP/PP/CP would
    # only add communication at seq 1024, and the distributed optimizer shards Adam state over DP for free.
    "210m": SizeLayout("eurobert-210m"),
    # 610m (head_dim 64, 6 KV heads): ~10 GB of weights/grads/Adam before sharding and ~25 GB of activations at
    # 12×1024 tokens fit an 80 GB H100, so TP=1 (TP would split 6 KV heads and shrink 1152-wide GEMMs); DP +
    # distributed optimizer.
    "610m": SizeLayout("eurobert-610m"),
    # 1b (head_dim 96): ~17 GB of weights/grads/Adam before sharding plus ~30 GB of activations (flash attention,
    # 12×1024 tokens, 128k-vocab logits) still fit one H100; TP=2 would be the first step if memory ran short
    # (6 KV heads split evenly, SP then on), but at this size its all-reduces cost more than they save.
    "1b": SizeLayout("eurobert-1b"),
}


def micro_batch_for(global_batch: int, data_parallel: int, max_micro: int) -> int:
    """The largest micro batch <= max_micro that splits global_batch evenly over data_parallel ranks.

    Accumulation = per-rank sequences / micro batch, so the global batch (in tokens) stays fixed when the
    number of nodes changes.
    """
    per_rank, rest = divmod(global_batch, data_parallel)
    if rest or per_rank == 0:
        raise ValueError(f"global batch {global_batch} sequences cannot be split evenly over {data_parallel} "
                         f"data-parallel ranks; choose a node count whose data-parallel size divides {global_batch}")
    return max(m for m in range(1, min(max_micro, per_rank) + 1) if per_rank % m == 0)


@dataclass(frozen=True)
class Phase:
    """A phase as recipes describe it: an objective and its share of the run (or fixed steps)."""

    kind: str
    fraction: float | None = None
    steps: int | None = None
    mask_ratio: float = 0.4
    mask_mode: str = "mask_only"
    # beyond the paper (docs/training.md): a mask-rate schedule, a raised RoPE θ / context, the phase's own data
    mask_schedule: str = "constant"
    mask_ratio_end: float | None = None
    rope_theta: float | None = None
    max_position_embeddings: int | None = None
    data_path: str | None = None
    random_length: tuple[int, int] | None = None  # with data_path: the phase's own sample lengths
    name: str | None = None  # default: the objective's kind
    restart_schedule: ScheduleConfig | None = None  # the LR schedule restarts here, optimizer state kept


def _config_of(obj) -> run.Config:
    """A flat dataclass instance -> the equivalent `run.Config` (so CLI overrides can reach every field)."""
    return run.Config(type(obj), **{f.name: getattr(obj, f.name) for f in fields(obj)})


def _phase_config(phase: Phase, tokenizer: str | None, seed: int) -> run.Config:
    data = None if phase.data_path is None else run.Config(
        DataConfig, path=phase.data_path, tokenizer=tokenizer, seed=seed,
        random_length=None if phase.random_length is None else run.Config(SampleLengths, *phase.random_length))
    restart = None if phase.restart_schedule is None else _config_of(phase.restart_schedule)
    return run.Config(PhaseConfig, steps=phase.steps, fraction=phase.fraction, name=phase.name,
                      rope_theta=phase.rope_theta, restart_schedule=restart,
                      max_position_embeddings=phase.max_position_embeddings, data=data,
                      objective=run.Config(ObjectiveConfig, kind=phase.kind, mask_ratio=phase.mask_ratio,
                                           mask_mode=phase.mask_mode, mask_schedule=phase.mask_schedule,
                                           mask_ratio_end=phase.mask_ratio_end))


def train_partial(
    *,
    model: ModelConfig,
    layout: SizeLayout | ParallelConfig,
    phases: list[Phase],
    total_steps: int,
    global_batch_size: int,
    nodes: int,
    gpus_per_node: int,
    data_path: str,
    run_dir: str,
    tokenizer: str | None = None,
    warmup_steps: int = PAPER_WARMUP_STEPS,
    decay_steps: int | None = PAPER_DECAY_STEPS,
    lr: float = 5e-4,
    init_from: str | None = None,
    fp8: bool = True,
    max_micro_batch: int = PAPER_SEQS_PER_GPU,
    save_interval: int | None = 1000,
    log_interval: int = 10,
    seed: int = 1234,
    random_length: tuple[int, int] | None = None,
    validation_interval: int = 1000,
    optimizer: OptimizerConfig | None = None,
    schedule: ScheduleConfig | None = None,
) -> run.Partial:
    """The common base: every recipe is this with its own arguments; validated before it is returned.
    `optimizer` / `schedule` replace the paper's (then `lr`, `warmup_steps` and `decay_steps` are not read)."""
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"nodes and gpus_per_node must be >= 1, got {nodes} and {gpus_per_node}")
    parallel = layout.parallel() if isinstance(layout, SizeLayout) else layout
    dp = parallel.data_parallel_size(nodes * gpus_per_node)
    micro = micro_batch_for(global_batch_size, dp, max_micro_batch)
    config = run.Config(
        TrainConfig,
        run_dir=run_dir,
        model=run.Config(ModelConfig, **model.to_dict()),
        data=run.Config(DataConfig, path=data_path, tokenizer=tokenizer, seed=seed,
                        random_length=None if random_length is None else run.Config(SampleLengths, *random_length)),
        phases=[_phase_config(p, tokenizer, seed) for p in phases],
        total_steps=total_steps,
        global_batch_size=global_batch_size,
        micro_batch_size=micro,
        parallel=_config_of(parallel),
        # The paper's optimizer: AdamW β (0.9, 0.95), eps 1e-5, wd 0.1, clip 1.0.
        optimizer=_config_of(optimizer) if optimizer is not None else run.Config(
            OptimizerConfig, lr=lr, beta1=0.9, beta2=0.95, eps=1e-5, weight_decay=0.1, clip_grad=1.0,
            distributed_optimizer=getattr(layout, "distributed_optimizer", True)),
        schedule=_config_of(schedule) if schedule is not None else run.Config(
            ScheduleConfig, style="wsd", warmup_steps=warmup_steps, decay_steps=decay_steps, decay_shape="linear"),
        precision=run.Config(PrecisionConfig, dtype="auto", fp8="hybrid" if fp8 else None, fp8_attention="auto"),
        checkpoint=run.Config(CheckpointConfig, save_interval=save_interval, init_from=init_from),
        logging=run.Config(LoggingConfig, log_interval=log_interval),
        # On the split the data's manifest records (prepare_data --validation-every K); none recorded: no validation.
        validation=run.Config(ValidationConfig, interval=validation_interval),
        seed=seed,
        use_te=True if fp8 else None,  # FP8 needs TE layers; without FP8, TE is used when importable
        # The paper attends across the documents inside a sample (random-length samples confine attention to each
        # sample; fixed rows attend over the whole row), as the authors' Optimus trainer does.
        per_document_attention=False,
    )
    partial = run.Partial(pretrain_entry, config=config, nodes=nodes, gpus_per_node=gpus_per_node)
    validate(partial)
    return partial


def tokens_per_sample(cfg: TrainConfig, seq_length: int) -> float:
    """Mean tokens of one sample: the mean random length, or the data's fixed row length."""
    lengths = cfg.data.random_length
    return seq_length if lengths is None else lengths.mean


def paper_model(size: str) -> tuple[ModelConfig, SizeLayout]:
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose one of {sorted(SIZES)}")
    layout = SIZES[size]
    return preset(layout.preset), layout


# --- validation -------------------------------------------------------------------------------------------------

def world_size(partial: run.Partial) -> int:
    return partial.nodes * partial.gpus_per_node


def validate(partial: run.Partial) -> TrainConfig:
    """Build the TrainConfig (its own checks run) and check what only the launch shape reveals.

    Raises ValueError naming the problem: layout vs model, world size vs layout, global batch vs micro batch × DP,
    interleaved schedule, WSD schedule vs run length, and the CLM→MLM switch placed before the WSD decay.
    """
    try:
        cfg: TrainConfig = fdl.build(partial.config)
    except (ValueError, TypeError) as err:
        # fiddle re-raises a proxy whose message adds the whole failed call (every TrainConfig argument, ~2 KB);
        # the cause is what our config's own check raised, and that is what a refusal prints
        while hasattr(err, "proxy_base_exception"):
            err = err.proxy_base_exception
        raise err from None
    cfg.num_microbatches(cfg.parallel.data_parallel_size(world_size(partial)))
    sched, steps = cfg.schedule, cfg.phase_steps()
    decay = sched.decay_for(cfg.total_steps)
    if sched.style == "wsd":
        if len(steps) > 1 and decay > steps[-1]:
            raise ValueError(
                f"the switch to the last phase ('{cfg.phases[-1].name}', {steps[-1]} steps) must come before the "
                f"WSD decay ({decay} steps): the decay has to fit inside the last phase")
    return cfg
