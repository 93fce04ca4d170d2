"""The training config tree: validated before any process group starts, saved next to every checkpoint."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path

from mlmclm import config_io
from mlmclm.data.random_length import SampleLengths
from mlmclm.model.head_chunks import DEFAULT_CHUNK_TOKENS, validate_chunk_tokens
from mlmclm.model.config import ModelConfig, preset
from mlmclm.model.precision import PrecisionConfig
from mlmclm.objectives import ObjectiveConfig
from mlmclm.parallel.runtime import ParallelConfig
from mlmclm.path_names import check_plain_name, is_plain_name
from mlmclm.train.optim_config import OptimizerConfig, ScheduleConfig


# More samples per step than this is a typo (global_batch_size=1e12), not a batch: refused when the config is built,
# before any process starts (it would otherwise try to read that many rows every step). 2^24 is 1,000 times the
# largest global batch in the paper's recipes.
MAX_GLOBAL_BATCH_SIZE = 1 << 24

# The model fields a phase may raise (PhaseConfig): TrainConfig.phase_models carries them from phase to phase.
PHASE_MODEL_FIELDS = ("rope_theta", "max_position_embeddings")


@dataclass
class PhaseConfig:
    """One phase of a run: an objective for `steps` steps, or for `fraction` of the run's total steps."""

    objective: ObjectiveConfig
    steps: int | None = None
    fraction: float | None = None
    name: str | None = None  # default: "clm", or "mlm" — also the phase's TensorBoard run folder
    # A long-context phase (ModernBERT's: θ 10,000 → 160,000 for its 8,192-token phase): the RoPE base from this
    # phase on, switched in place at its first step (weights unchanged; mlmclm.model.rope). None: the previous
    # phase's, the first phase's being model.rope_theta. It may only rise.
    rope_theta: float | None = None
    # The context the model is trained for from this phase on (the HF export's max_position_embeddings). None: the
    # previous phase's, the first phase's being model.max_position_embeddings. It may only rise.
    max_position_embeddings: int | None = None
    # The phase's own data (one dataset or a blend, its seed, its sample lengths): a long-context phase reads rows
    # prepared at its length. None: the run's `data`. Phases naming the same data share one position in it
    # (mlmclm.train.phase_data), so a plan A → B → A reads on in A where it left off.
    data: DataConfig | None = None
    # The learning-rate schedule starts again at this phase's first step with this curve, over the phase and the
    # phases after it up to the next restart (the CLM detour's MLM decay: a 1-√ cooldown); the optimizer's state —
    # AdamW's moments and step count — is kept (mlmclm.train.schedule_restarts). None: the run's curve goes on.
    restart_schedule: ScheduleConfig | None = None

    def __post_init__(self):
        if self.rope_theta is not None and (isinstance(self.rope_theta, bool) or
                                            not isinstance(self.rope_theta, (int, float)) or not self.rope_theta > 0):
            raise ValueError(f"phase.rope_theta must be a number > 0 or null, got {self.rope_theta!r}")
        if self.max_position_embeddings is not None and (isinstance(self.max_position_embeddings, bool) or
                                                         not isinstance(self.max_position_embeddings, int) or
                                                         self.max_position_embeddings < 1):
            raise ValueError(f"phase.max_position_embeddings must be an integer >= 1 or null, got "
                             f"{self.max_position_embeddings!r}")
        if (self.steps is None) == (self.fraction is None):
            raise ValueError("phase: give exactly one of `steps` or `fraction`")
        if self.steps is not None and self.steps < 1:
            raise ValueError(f"phase.steps must be >= 1, got {self.steps}")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"phase.fraction must be in (0, 1], got {self.fraction}")
        if self.name is None:
            self.name = self.objective.kind
        check_plain_name(self.name, "phase.name", "it names the phase's metrics and TensorBoard folder")


@dataclass
class DataConfig:
    path: str | None = None  # prepared shards: a directory, a manifest.json, or a URL webdataset can read
    seed: int = 1234
    skip_corrupt: bool = False
    # The tokenizer that prepared the data ("embedded", a local directory or a hub name): checked against the
    # manifest at start, and copied next to exported Hugging Face models.
    tokenizer: str | None = None
    blend: dict[str, float] | None = None  # instead of `path`: {dataset path: weight} (mlmclm.data.blend)
    # The paper's samples: lengths uniform in [min_length, max_length], laid end to end in a micro-batch with
    # attention confined to each (mlmclm.data.random_length); micro and global batches then count these samples.
    # None: the prepared fixed-length rows, attention across each whole row.
    random_length: SampleLengths | None = None

    def __post_init__(self):
        if (self.path is None) == (not self.blend):
            raise ValueError("data: give exactly one of `path` (one dataset) or `blend` ({path: weight}, non-empty)")
        if self.blend and any(isinstance(w, bool) or not isinstance(w, (int, float)) or not w > 0
                              or not math.isfinite(w) for w in self.blend.values()):
            raise ValueError(f"data.blend: weights must be positive finite numbers, got {self.blend}")


@dataclass
class CheckpointConfig:
    save_interval: int | None = None  # steps; phase ends and the run's end are always saved
    keep_last: int | None = None  # prune older periodic checkpoints (phase-end ones are kept)
    init_from: str | None = None  # continued pretraining: start from this checkpoint's *weights* only
    resume: bool = True  # continue this run from its latest complete checkpoint, if any
    # Fields (dotted prefixes) a resume may change although the run then no longer continues exactly, e.g.
    # [total_steps, phases, schedule] to extend a run. What may always change is listed in train/resume_check.py.
    allow_resume_changes: list[str] | str = field(default_factory=list)  # a str is split on commas
    # A branch (mlmclm.train.branch): start from the parent run's checkpoint of step `branch_step` with its full
    # state (weights, optimizer, schedule position, data position, RNG), then follow this config's plan.
    branch_from: str | None = None  # the parent's run directory (or its checkpoints or iter_* directory)
    branch_step: int | None = None
    keep_steps: list[int] = field(default_factory=list)  # also save at these steps, never pruned (children's branches)
    stop_at: int | None = None  # end this job after saving at this step (a segment); a resume continues the run
    # Train in a run_dir that is not empty and holds no run of ours (mlmclm.train.run_lock.check_run_dir_is_ours).
    allow_foreign_run_dir: bool = False

    def __post_init__(self):
        if (self.branch_from is None) != (self.branch_step is None):
            raise ValueError("checkpoint.branch_from and checkpoint.branch_step go together (the parent and the step)")
        if self.branch_from is not None and self.init_from is not None:
            raise ValueError("checkpoint.branch_from and checkpoint.init_from exclude each other: a branch continues "
                             "the parent's full state, init_from takes its weights only")
        for name, value in (("branch_step", self.branch_step), ("stop_at", self.stop_at),
                            *(("keep_steps", s) for s in self.keep_steps)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"checkpoint.{name} must hold steps >= 1, got {value!r}")
        if isinstance(self.allow_resume_changes, str):  # `checkpoint.allow_resume_changes=[a,b]` on a command line
            self.allow_resume_changes = [f.strip() for f in self.allow_resume_changes.strip("[]").split(",")
                                         if f.strip()]
        if self.save_interval is not None and self.save_interval < 1:
            raise ValueError("checkpoint.save_interval must be >= 1 or null")
        if self.keep_last is not None and self.keep_last < 1:
            raise ValueError("checkpoint.keep_last must be >= 1 or null")


@dataclass
class ValidationConfig:
    """Held-out loss (mlmclm.train.validation): the CLM loss and the MLM loss at `mask_ratio`, on the same samples
    every `interval` steps, at each phase end and at the run's end, whatever objective the run trains."""

    enabled: bool | None = None  # None: when the data's manifest records a validation split (or `path` is given)
    interval: int = 1000
    samples: int | None = None  # held-out samples per evaluation; default: one global batch
    mask_ratio: float = 0.4  # the reference MLM ratio (the paper's main one), independent of the training ratio
    path: str | None = None  # a prepared dataset; default: the split recorded in the data's manifest

    def __post_init__(self):
        if self.interval < 1:
            raise ValueError(f"validation.interval must be >= 1, got {self.interval}")
        if self.samples is not None and self.samples < 1:
            raise ValueError(f"validation.samples must be >= 1 or null, got {self.samples}")
        if not 0.0 < float(self.mask_ratio) < 1.0:
            raise ValueError(f"validation.mask_ratio must be strictly between 0 and 1, got {self.mask_ratio!r}")
        if self.enabled is False and self.path is not None:
            raise ValueError("validation.path is set but validation.enabled is false")


@dataclass
class LoggingConfig:
    log_interval: int = 10  # console line every N steps (rank 0); TensorBoard gets every step
    tensorboard: bool = True
    peak_tflops: float | None = None  # per-GPU peak for MFU; default looked up from the device name
    run_name: str | None = None  # TensorBoard's name of the run (RUN/tensorboard/NAME); default: the run dir's name

    def __post_init__(self):
        if self.run_name is not None:
            check_plain_name(self.run_name, "logging.run_name", "it names the run's TensorBoard folder")
        if self.peak_tflops is not None and not (isinstance(self.peak_tflops, (int, float)) and
                                                 math.isfinite(self.peak_tflops) and self.peak_tflops > 0):
            raise ValueError(f"logging.peak_tflops must be a finite number > 0 or null, got {self.peak_tflops!r}")


def check_run_dir(run_dir: str) -> None:
    """Refuse a run_dir that is, or lies inside, something other than a folder (a file): every rank would fail on
    it after starting. Only what exists here is looked at: a cluster path absent from the submitting machine
    passes, as it must."""
    path = Path(run_dir)
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                where = "is" if candidate == path else f"lies inside {candidate}, which is"
                raise ValueError(f"run_dir {run_dir}: it {where} a file, not a folder")
            return


@dataclass
class TrainConfig:
    run_dir: str
    model: ModelConfig
    data: DataConfig
    phases: list[PhaseConfig]
    total_steps: int
    global_batch_size: int
    micro_batch_size: int = 1
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    seed: int = 1234
    max_consecutive_nonfinite: int = 3  # abort after this many skipped (NaN/Inf) steps in a row
    use_te: bool | None = None  # Transformer Engine layers: None = when available
    # Python GC every N steps on every rank instead of automatically (0 = automatic). 100 as in NVIDIA's
    # Megatron-Bridge recipes (manual_gc=True, manual_gc_interval=100); see mlmclm.train.step.ManualGC.
    manual_gc_interval: int = 100
    # MLM phases run the output layer and cross entropy at the masked positions only (mlmclm.model.sparse_head;
    # ModernBERT's "sparse prediction"): same loss and gradients as the full head (<= 1e-6 relative, tested on
    # every layout), ~60 % of the head's FLOPs saved at mask ratio 0.4. Ours; false = the head at every position.
    sparse_mlm_head: bool = True
    # The output layer + cross entropy over this many tokens at a time (mlmclm.model.chunked_head): the
    # [tokens, vocab] logits never exist beyond one chunk; same loss and gradients within float reassociation
    # (tested on every layout), free to change on resume. 0 = megatron's output layer and loss on all the logits.
    head_chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    # megatron's fused kernels, each on only where its kernel exists for the spec in use (mlmclm.model.fusions);
    # false switches them all off (for comparing speed, or ruling a kernel out while debugging).
    fused_kernels: bool = True
    # Attention within each packed document only (mlmclm.model.document_attention). Off by default, as in the
    # paper: the authors' Optimus trainer packs documents into fixed-size blocks and attends across the block.
    per_document_attention: bool = False
    # Bit-reproducible GPU runs (mlmclm.train.determinism: megatron deterministic_mode, deterministic cuBLAS/TE
    # kernels, NCCL_ALGO=Ring). Off by default, as in Megatron-LM: it costs speed. CPU runs are reproducible anyway.
    deterministic: bool = False

    def __post_init__(self):
        # Types and finiteness of every field first (recipes build this tree without from_dict's type checks):
        # the checks below compare numbers, and NaN or 1e12-as-a-float would slip through them
        config_io.check_fields(self)
        check_run_dir(self.run_dir)
        if not self.phases:
            raise ValueError("phases: a run needs at least one phase")
        if self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {self.total_steps}")
        if self.global_batch_size < 1 or self.micro_batch_size < 1:
            raise ValueError("global_batch_size and micro_batch_size must be >= 1")
        if self.global_batch_size > MAX_GLOBAL_BATCH_SIZE:
            raise ValueError(f"global_batch_size {self.global_batch_size} is beyond any batch (at most "
                             f"{MAX_GLOBAL_BATCH_SIZE} samples a step)")
        if self.max_consecutive_nonfinite < 1:
            raise ValueError("max_consecutive_nonfinite must be >= 1")
        if self.head_chunk_tokens != 0:
            validate_chunk_tokens(self.head_chunk_tokens)
        if self.manual_gc_interval < 0:
            raise ValueError(f"manual_gc_interval must be >= 0 (0 = automatic GC), got {self.manual_gc_interval}")
        models = self.phase_models()  # validates that θ and the context never fall from one phase to the next
        self.data_streams()  # validates the phases' data (no dataset read twice from its start)
        for index, (data, model) in enumerate(zip(self.phase_data(), models)):
            lengths = data.random_length
            if lengths is not None and lengths.max_length > model.max_position_embeddings:
                field = "data" if self.phases[index].data is None else f"phases[{index}].data"
                raise ValueError(f"{field}.random_length.max_length {lengths.max_length} exceeds the "
                                 f"max_position_embeddings {model.max_position_embeddings} of phase {index} "
                                 f"(model.max_position_embeddings or a phase's own)")
        if self.validation.samples is not None and self.validation.samples % self.micro_batch_size:
            raise ValueError(f"validation.samples {self.validation.samples} is not a multiple of micro_batch_size "
                             f"{self.micro_batch_size}")
        self.phase_steps()  # validates that the phases fill the run exactly
        for name, step in (("branch_step", self.checkpoint.branch_step), ("stop_at", self.checkpoint.stop_at)):
            if step is not None and step >= self.total_steps:
                raise ValueError(f"checkpoint.{name} {step} must be < total_steps {self.total_steps}")
        if any(step > self.total_steps for step in self.checkpoint.keep_steps):
            raise ValueError(f"checkpoint.keep_steps {self.checkpoint.keep_steps} must be <= total_steps "
                             f"{self.total_steps}")
        for (start, schedule), end in zip(self.schedule_spans(), self.schedule_span_ends()):
            if schedule.warmup_tokens is None:  # in tokens: checked when the run knows its tokens per step
                schedule.check(end - start)
        self.model.validate_layout(self.parallel)
        if self.precision.fp8 and self.precision.fp8_attention == "on" and self.packed_segments:
            raise ValueError("precision.fp8_attention: on cannot run with "
                             + ("data.random_length" if self.data.random_length is not None else
                                "per_document_attention")
                             + ": attention then runs on packed THD segments, and Transformer Engine's FP8 attention "
                               "takes only padded layouts (bshd/sbhd); set precision.fp8_attention to auto or off "
                               "(attention in bf16, GEMMs still in FP8)")
        if self.precision.fp8 and self.precision.fp8_attention == "on" and self.deterministic:
            raise ValueError("precision.fp8_attention: on cannot run with deterministic: true: Transformer Engine "
                             "drops its FP8 fused attention in deterministic training (TE 2.2-2.12 always, newer TE "
                             "with cuDNN < 9.19) and no other backend runs FP8 attention; set precision.fp8_attention "
                             "to auto or off (attention in bf16, GEMMs still in FP8)")

    def schedule_spans(self) -> list[tuple[int, ScheduleConfig]]:
        """(first step, curve) of each span of the learning-rate schedule: the run's `schedule` from step 0, then one
        span from each phase with a `restart_schedule`."""
        spans = [(0, self.schedule)]
        for index, (phase, (start, _)) in enumerate(zip(self.phases, self.phase_bounds())):
            if phase.restart_schedule is not None:
                if index == 0:
                    raise ValueError("phases[0].restart_schedule: the first phase starts the run's schedule; set "
                                     "`schedule` instead")
                spans.append((start, phase.restart_schedule))
        return spans

    def schedule_span_ends(self) -> list[int]:
        return [start for start, _ in self.schedule_spans()[1:]] + [self.total_steps]

    def worst_row_tokens(self, seq_length: int, data: DataConfig | None = None) -> int:
        """The longest row attention can see: a micro-batch of random-length samples all of the longest length
        (padding aside), or a prepared row of `seq_length` (of `data`, by default the run's)."""
        lengths = (data or self.data).random_length
        return self.micro_batch_size * lengths.max_length if lengths is not None else seq_length

    def phase_data(self) -> list[DataConfig]:
        """The data each phase reads: its own, or the run's."""
        return [phase.data if phase.data is not None else self.data for phase in self.phases]

    def data_streams(self) -> tuple[list[DataConfig], list[int]]:
        """The distinct data the phases read, in order of first use, and each phase's index into them.

        Refused, naming the phase: two different data configs over one dataset (the second would read it again
        from its start: a length change of the same data means preparing it at that length), and a plan mixing
        random-length samples with prepared rows (the model's attention layout is built once for the run)."""
        streams, of_phase, keys = [], [], []
        for data in self.phase_data():
            key = config_io.to_dict(data)
            if key not in keys:
                keys.append(key)
                streams.append(data)
            of_phase.append(keys.index(key))
        owner: dict[str, int] = {}
        for index, data in enumerate(self.phase_data()):
            for location in (data.blend or {data.path: 1}):
                first = owner.setdefault(location, of_phase[index])
                if first != of_phase[index]:
                    raise ValueError(
                        f"phases[{index}].data reads {location!r}, which an earlier phase reads with other settings "
                        f"(seed, blend, sample lengths, tokenizer or skip_corrupt): it would read the dataset again "
                        f"from its start. Give the phase a dataset of its own (prepared at its length), or the "
                        f"earlier phase's data")
        if len({data.random_length is None for data in [self.data, *streams]}) > 1:
            raise ValueError("phases[].data: random-length samples (data.random_length) in some phases and "
                             "prepared rows in others are not implemented (the model's attention layout is "
                             "built once for the run); give every phase's data random_length, or none")
        return streams, of_phase

    @property
    def packed_segments(self) -> bool:
        """Whether batches are cut into attention segments: random-length samples or per-document attention (THD on
        Transformer Engine layers, an explicit mask on local ones; mlmclm.model.document_attention)."""
        return any(data.random_length is not None for data in self.phase_data()) or self.per_document_attention

    @classmethod
    def coerce(cls, data: dict) -> dict:
        """Accept `model: {preset: NAME, ...overrides}` besides a full model dict."""
        model = data.get("model")
        if isinstance(model, str):
            data = {**data, "model": preset(model).to_dict()}
        elif isinstance(model, dict) and "preset" in model:
            overrides = {k: v for k, v in model.items() if k != "preset"}
            data = {**data, "model": preset(model["preset"], **overrides).to_dict()}
        return data

    def phase_steps(self) -> list[int]:
        """Steps of each phase; fractions are of total_steps, the last phase takes any rounding remainder."""
        steps = [p.steps if p.steps is not None else round(p.fraction * self.total_steps) for p in self.phases]
        if any(p.fraction is not None for p in self.phases) and self.phases[-1].fraction is not None:
            steps[-1] = self.total_steps - sum(steps[:-1])
        if sum(steps) != self.total_steps or any(s < 1 for s in steps):
            raise ValueError(f"phases: steps {steps} must be >= 1 each and sum to total_steps {self.total_steps}")
        return steps

    def phase_models(self) -> list[ModelConfig]:
        """The model each phase trains: model, with each phase's RoPE θ and context carried until a later phase
        raises them. Refuses a θ or a context that falls, naming the phase's field."""
        models, current = [], self.model
        for index, phase in enumerate(self.phases):
            raised = {name: getattr(phase, name) for name in PHASE_MODEL_FIELDS if getattr(phase, name) is not None}
            for name, value in raised.items():
                if value < getattr(current, name):
                    raise ValueError(f"phases[{index}].{name} {value} is below the {getattr(current, name)} in force "
                                     f"before it (model.{name} or an earlier phase's): a phase may raise it, not "
                                     f"lower it")
            current = replace(current, **raised)
            models.append(current)
        return models

    def phase_bounds(self) -> list[tuple[int, int]]:
        """[start, end) step ranges of the phases."""
        bounds, start = [], 0
        for steps in self.phase_steps():
            bounds.append((start, start + steps))
            start += steps
        return bounds

    def phase_at(self, step: int) -> int:
        for index, (start, end) in enumerate(self.phase_bounds()):
            if start <= step < end:
                return index
        raise ValueError(f"step {step} is outside the run's {self.total_steps} steps")

    def num_microbatches(self, data_parallel_size: int) -> int:
        per_round = self.micro_batch_size * data_parallel_size
        if self.global_batch_size % per_round:
            raise ValueError(
                f"global_batch_size {self.global_batch_size} is not divisible by micro_batch_size × data-parallel "
                f"size = {self.micro_batch_size}×{data_parallel_size}"
            )
        num_micro = self.global_batch_size // per_round
        if self.parallel.virtual_pipeline_parallel and num_micro % self.parallel.pipeline_parallel:
            raise ValueError(f"the interleaved schedule needs the {num_micro} micro-batches per step divisible by "
                             f"pipeline_parallel {self.parallel.pipeline_parallel}")
        return num_micro

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.run_dir) / "checkpoints"

    @property
    def tensorboard_dir(self) -> Path:
        return Path(self.run_dir) / "tensorboard"

    @property
    def tensorboard_run_name(self) -> str:
        """The run's name in TensorBoard: its events lie in tensorboard_dir / this name (mlmclm/tensorboard_tags.py)."""
        if self.logging.run_name is not None:
            return self.logging.run_name
        name = Path(self.run_dir).resolve().name
        return name if is_plain_name(name) else "run"

    def to_dict(self) -> dict:
        return config_io.to_dict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "TrainConfig":
        return config_io.from_dict(cls, data)

    @classmethod
    def from_file(cls, path: str | Path, overrides: list[str] | None = None) -> "TrainConfig":
        data = config_io.load_file(path)
        return cls.from_dict(config_io.apply_overrides(data, overrides or []))
