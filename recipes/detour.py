"""Domain adaptation of an existing encoder: the CLM detour as its authors ran it, and its control.

The published settings (the first author's thesis, chapter "based on COLM 2026" and appendix "Pretraining
Configurations for the CLM Detour"; each default's source line is in recipes/README.md, "Domain adaptation: the CLM
detour"): start from ModernBERT or ModernCamemBERT (base or large; any `ModernBertForMaskedLM`, or a EuroBERT);
phase 1 on n tokens — CLM for the detour, MLM at 30 % for the control; phase 2 on 0.1·n tokens, MLM at 15 % for
both, the optimizer state kept and only the scheduler restarted (a 1-√ cooldown from the peak to 2e-5); decoupled
AdamW at 2e-4 constant after a 100M-token warmup, β (0.9, 0.98), eps 1e-6, weight decay 1e-5; 384 packed rows of
8,192 tokens a step, bf16.

From a Hugging Face model (a hub name or a local directory) the family builds three tasks:

1. `import`: our own `convert_from_hf` turns the model into a run-shaped checkpoint (weights only), and the
   trainer's validation measures the imported model's held-out losses on the domain's validation split (step 0);
2. `detour`: phase 1 CLM, then phase 2 (the MLM decay);
3. `control`: phase 1 MLM at 30 %, then the same phase 2 — the same steps, data, seed and optimizer.

Both start from the import (`checkpoint.init_from`: a fresh optimizer for phase 1) and validate at the switch and
at the end, so the report (recipes/detour_report.py) reads the held-out MLM loss (at phase 2's 15 %) at step 0, at
the end of phase 1 and at the end, for both. `tiny_detour` is the CPU twin, on a tiny ModernBERT."""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import nemo_run as run

from mlmclm.model.config import ModelConfig
from mlmclm.parallel.runtime import ParallelConfig
from mlmclm.train.optim_config import OptimizerConfig, ScheduleConfig
from recipes.base import Phase, train_partial, validate

# The published settings (recipes/README.md gives each one's source)
DECAY_SHARE = 0.1          # phase 2 on 0.1·n tokens
CONTROL_MASK_RATIO = 0.30  # the control's phase 1
DECAY_MASK_RATIO = 0.15    # phase 2, both runs
LEARNING_RATE, MIN_LR = 2e-4, 2e-5
WARMUP_TOKENS = 100_000_000
BETAS, EPS, WEIGHT_DECAY = (0.9, 0.98), 1e-6, 1e-5
GLOBAL_BATCH, SEQ_LENGTH = 384, 8192
PHASE1_TOKENS = 10_000_000_000  # the French runs' detour (the English: 50B)
# Ours where the text says nothing: gradient clipping (the trainer's 1.0) and the masking (the trainer's mask_only)
CLIP_GRAD = 1.0


@dataclass(frozen=True)
class DetourPlan:
    """The import step and the two training runs; `root` holds them and the report."""

    source: str
    root: Path
    imported: Path  # the converted checkpoint (a run-shaped directory)
    detour: run.Partial
    control: run.Partial
    phase1_steps: int
    processes: int  # of the step-0 measurement

    @property
    def step0_file(self) -> Path:
        return self.root / "step0_held_out.json"


def source_model(source: str, make_vocab_divisible_by: int = 128) -> ModelConfig:
    """The shape `convert_from_hf` will give the source (read from its config.json: a local directory, or the hub's
    copy of that one file), so the training config matches the imported checkpoint."""
    from transformers import AutoConfig

    from mlmclm.convert.architecture_config import model_config_from_hf

    path = Path(source)
    if not path.is_dir():
        if path.exists() or source.startswith((".", "/")) or source.count("/") != 1:
            raise ValueError(f"source {source}: not a model directory (and not a hub name like 'org/model')")
    try:
        hf = AutoConfig.from_pretrained(source, trust_remote_code=False)
    except Exception as err:  # offline hub name, unreadable config: one line
        raise ValueError(f"source {source}: its config.json cannot be read: {type(err).__name__}: {err}") from None
    return model_config_from_hf(hf, path.name, make_vocab_divisible_by).model


def published_optimizer(lr: float, min_lr: float) -> OptimizerConfig:
    return OptimizerConfig(lr=lr, min_lr=min_lr, beta1=BETAS[0], beta2=BETAS[1], eps=EPS,
                           weight_decay=WEIGHT_DECAY, decoupled_weight_decay=True, clip_grad=CLIP_GRAD)


def detour_plan(source: str, data_path: str, root: str, *, steps: int, decay_share: float = DECAY_SHARE,
                control_mask_ratio: float = CONTROL_MASK_RATIO, decay_mask_ratio: float = DECAY_MASK_RATIO,
                lr: float = LEARNING_RATE, min_lr: float = MIN_LR, warmup_tokens: int = WARMUP_TOKENS,
                global_batch_size: int, nodes: int, gpus_per_node: int, max_micro_batch: int, seq_length: int,
                tokenizer: str | None, seed: int, layout: ParallelConfig | None = None,
                validation_samples: int | None = None, model: ModelConfig | None = None) -> DetourPlan:
    """The family's one builder (paper scale and CPU twin choose its arguments). `steps`: phase 1's steps (n);
    phase 2 takes `decay_share` of them."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps (phase 1) must be an integer >= 1, got {steps!r}")
    if not 0 < decay_share <= 1:
        raise ValueError(f"decay_share must be in (0, 1] (phase 2's share of phase 1), got {decay_share}")
    decay_steps = round(steps * decay_share)
    if decay_steps < 1:
        raise ValueError(f"steps={steps} with decay_share={decay_share} leaves no step for phase 2 (the MLM decay)")
    model = model or source_model(source)
    if seq_length > model.max_position_embeddings:
        raise ValueError(f"seq_length {seq_length} exceeds the source's max_position_embeddings "
                         f"{model.max_position_embeddings}")
    row_tokens = global_batch_size * seq_length
    if warmup_tokens >= steps * row_tokens:
        raise ValueError(f"the warmup ({warmup_tokens:,} tokens, {math.ceil(warmup_tokens / row_tokens)} steps of "
                         f"{row_tokens:,}) must end inside phase 1 ({steps} steps)")
    root_path = Path(root)
    imported = root_path / "imported"
    total = steps + decay_steps
    cooldown = ScheduleConfig(style="cooldown", decay_shape="minus_sqrt")

    def partial(name: str, phase1: Phase) -> run.Partial:
        phases = [phase1, Phase("mlm", steps=decay_steps, mask_ratio=decay_mask_ratio, name="mlm_decay",
                                restart_schedule=cooldown)]
        built = train_partial(
            model=model, layout=layout or ParallelConfig(), phases=phases, total_steps=total,
            global_batch_size=global_batch_size, nodes=nodes, gpus_per_node=gpus_per_node, data_path=data_path,
            run_dir=str(root_path / name), tokenizer=tokenizer, init_from=str(imported), fp8=False,
            max_micro_batch=max_micro_batch, save_interval=None, log_interval=max(1, total // 10), seed=seed,
            validation_interval=steps,  # at the switch (both runs) and at the end
            optimizer=published_optimizer(lr, min_lr),
            schedule=ScheduleConfig(style="constant", warmup_tokens=warmup_tokens))
        built.config.validation.mask_ratio = decay_mask_ratio
        if validation_samples is not None:
            built.config.validation.samples = validation_samples
        validate(built)
        return built

    detour = partial("detour", Phase("clm", steps=steps, name="clm"))
    control = partial("control", Phase("mlm", steps=steps, mask_ratio=control_mask_ratio, name="mlm"))
    return DetourPlan(source, root_path, imported, detour, control, steps, gpus_per_node)


def steps_for_tokens(tokens: int, global_batch_size: int = GLOBAL_BATCH, seq_length: int = SEQ_LENGTH) -> int:
    """Phase 1's steps for `tokens` (n) at packed rows of `seq_length` tokens, `global_batch_size` a step."""
    return max(1, round(tokens / (global_batch_size * seq_length)))


def detour_published(source: str, data_path: str, root: str, tokens: int = PHASE1_TOKENS,
                     decay_share: float = DECAY_SHARE, lr: float = LEARNING_RATE, nodes: int = 1,
                     gpus_per_node: int = 4, max_micro_batch: int = 2, seed: int = 17,
                     model: ModelConfig | None = None) -> DetourPlan:
    """Paper scale as published: phase 1 on `tokens` (the French runs' 10B = 3,179 steps of 384 × 8,192), 4 H100s
    of one node (the thesis' hardware), DP only (150M and 350M fit one GPU), bf16. Not run on a GPU here. `model`:
    the source's shape when its config.json is read elsewhere (Slurm: where this machine sees the job's path)."""
    return detour_plan(source, data_path, root, steps=steps_for_tokens(tokens), decay_share=decay_share, lr=lr,
                       global_batch_size=GLOBAL_BATCH, nodes=nodes, gpus_per_node=gpus_per_node,
                       max_micro_batch=max_micro_batch, seq_length=SEQ_LENGTH, tokenizer=None, seed=seed, model=model)


def tiny_detour(source: str, data_path: str, root: str, steps: int = 8, decay_share: float = 0.25,
                lr: float = 1e-3, warmup_tokens: int = 1024, processes: int = 2, seed: int = 17,
                validation_samples: int | None = 16, model: ModelConfig | None = None) -> DetourPlan:
    """The CPU twin: a tiny ModernBERT (`make_tiny_modernbert`), the demo's packed rows of 128 tokens, 8 per step;
    phase 2 a quarter of phase 1 (a tenth of 8 steps is under one), a peak a tiny random model learns from in a few
    steps, a one-step warmup (1,024 tokens); everything else as published."""
    return detour_plan(source, data_path, root, steps=steps, decay_share=decay_share, lr=lr, min_lr=lr / 10,
                       warmup_tokens=warmup_tokens, global_batch_size=8, nodes=1, gpus_per_node=processes,
                       max_micro_batch=2, seq_length=128, tokenizer=None, seed=seed,
                       validation_samples=validation_samples, model=model)


def make_tiny_modernbert(directory: Path, seed: int = 0) -> Path:
    """A random tiny `ModernBertForMaskedLM` (the `tiny-modernbert` preset's shape: both layer types, windows of 32
    tokens in the demo's 128-token rows, two RoPE θ) made with `transformers`, saved with the embedded demo
    tokenizer, so the demo's corpus is its domain data. Written only where nothing is."""
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    from mlmclm.convert.modernbert_config import modernbert_fields
    from mlmclm.model.config import preset

    def build(tokenizer):
        ids = {"bos_id": tokenizer.bos_token_id, "eos_id": tokenizer.eos_token_id, "pad_id": tokenizer.pad_token_id}
        shape = preset("tiny-modernbert", vocab_size=len(tokenizer))
        return ModernBertForMaskedLM(ModernBertConfig(**modernbert_fields(shape, ids, "fp32")))

    return _save_tiny(directory, seed, build, "ModernBERT")


def make_tiny_eurobert(directory: Path, seed: int = 0) -> Path:
    """A random tiny EuroBERT (the `tiny` preset's shape), saved with the embedded demo tokenizer (`--source` of
    the twin for a EuroBERT)."""
    from transformers import EuroBertConfig, EuroBertForMaskedLM

    def build(tokenizer):
        return EuroBertForMaskedLM(EuroBertConfig(
            vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=256, max_position_embeddings=1024,
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id, mask_token_id=tokenizer.mask_token_id, tie_word_embeddings=False))

    return _save_tiny(directory, seed, build, "EuroBERT")


def _save_tiny(directory: Path, seed: int, build, what: str) -> Path:
    import shutil

    import torch
    from transformers import AutoTokenizer

    from mlmclm.data.tokenizer import embedded_tokenizer_dir

    directory = Path(directory)
    if (directory / "config.json").exists():
        return directory
    if directory.exists() and any(directory.iterdir()):
        raise ValueError(f"{directory} is not empty and holds no model: refusing to write a tiny {what} into it")
    tokenizer = AutoTokenizer.from_pretrained(str(embedded_tokenizer_dir()), trust_remote_code=False)
    torch.manual_seed(seed)
    staging = directory.with_name(f".{directory.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    build(tokenizer).save_pretrained(str(staging))
    tokenizer.save_pretrained(str(staging))
    if directory.exists():
        directory.rmdir()  # empty (checked above)
    staging.replace(directory)
    return directory


def export_run(run_dir: str, imported: str, target: str) -> str:
    """One run's final checkpoint as a native HF directory (ModernBertForMaskedLM or EuroBertForMaskedLM, the
    source's architecture) with the source's tokenizer (carried by the import) and the sentence-transformers files;
    kept when already there (a repeated family exports nothing again). A function, so that Slurm runs it as a job."""
    from mlmclm.convert.to_hf import TOKENIZER_SUBDIR, ExportConfig, convert_to_hf
    from mlmclm.export.sentence_transformers import SentenceTransformerLayout
    from mlmclm.train import checkpoint_files as ckpt

    if not (Path(target) / "config.json").exists():
        tokenizer = ckpt.resolve_checkpoint(Path(imported)) / TOKENIZER_SUBDIR
        convert_to_hf(ExportConfig(run_dir, Path(target), progress=False, tokenizer=str(tokenizer),
                                   sentence_transformers=SentenceTransformerLayout()))
    return target


def import_and_measure(source: str, imported: str, config_json: str, out: str, processes: int = 1) -> dict:
    """The `import` task: convert the source (weights only; reused when already converted from the same source)
    and measure its held-out losses with the training runs' validation (step 0)."""
    import logging

    from mlmclm.convert.from_hf import ImportConfig, convert_from_hf
    from mlmclm.train import checkpoint_files as ckpt
    from mlmclm.train.config import TrainConfig
    from mlmclm.train.held_out import measure_checkpoint

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    path = Path(imported)
    if ckpt.latest_checkpoint(path / "checkpoints") is None:
        convert_from_hf(ImportConfig(source, path, progress=False))
    else:
        recorded = ckpt.read_json(ckpt.resolve_checkpoint(path), ckpt.RUN_CONFIG).get("converted_from", {})
        if recorded.get("source") != source:
            raise ValueError(f"{path} holds a conversion of {recorded.get('source')!r}, not of {source!r}")
    cfg = TrainConfig.from_dict(json.loads(config_json))
    return measure_checkpoint(cfg, str(path), Path(out), processes)


def import_task(plan: DetourPlan) -> run.Partial:
    """The `import` task of a plan (locally a NeMo-Run task of its own; on Slurm the family's first job)."""
    return run.Partial(import_and_measure, source=plan.source, imported=str(plan.imported),
                       config_json=json.dumps(validate(plan.control).to_dict()), out=str(plan.step0_file),
                       processes=plan.processes)
