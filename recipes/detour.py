"""Domain adaptation of an existing encoder: the CLM detour (arXiv 2605.12438) and its control.

From a Hugging Face EuroBERT (a hub name or a local directory) the family builds three tasks:

1. `import`: our own `convert_from_hf` turns the model into a run-shaped checkpoint (weights only), and the
   trainer's validation measures the imported model's held-out losses on the domain's validation split (step 0);
2. `detour`: CLM on the domain data for `clm_share` of the steps, then MLM, the WSD decay covering the MLM phase;
3. `control`: MLM only, the same steps, data, seed and schedule — only the first phase's objective differs.

Both start from the import (`checkpoint.init_from`: fresh optimizer, schedule and data position) and validate at
the switch and at the end (`validation.interval` = the CLM steps), so the report (recipes/detour_report.py) reads
the held-out MLM loss at step 0, at the end of the detour's CLM phase and at the end, for both. Defaults and their
sources: recipes/README.md, "Domain adaptation: the CLM detour". `tiny_detour` is the CPU twin."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import nemo_run as run

from mlmclm.model.config import ModelConfig
from mlmclm.parallel.runtime import ParallelConfig
from recipes.base import PAPER_GLOBAL_BATCH, PAPER_SAMPLE_LENGTHS, Phase, train_partial, validate

# Our choices where the follow-up's values could not be read here (recipes/README.md says which is which).
CLM_SHARE = 0.5
MASK_RATIO = 0.4  # the paper's main MLM ratio (arXiv 2507.00994)
LEARNING_RATE = 5e-4  # the paper's peak (from scratch); the follow-up's continued-pretraining peak: unknown here
WARMUP_SHARE = 0.1  # a fresh optimizer re-warms (as cpt_* does); not the follow-up's figure


@dataclass(frozen=True)
class DetourPlan:
    """The import step and the two training runs; `root` holds them and the report."""

    source: str
    root: Path
    imported: Path  # the converted checkpoint (a run-shaped directory)
    detour: run.Partial
    control: run.Partial
    clm_steps: int
    processes: int  # of the step-0 measurement

    @property
    def step0_file(self) -> Path:
        return self.root / "step0_held_out.json"


def source_model(source: str, make_vocab_divisible_by: int = 128) -> ModelConfig:
    """The shape `convert_from_hf` will give the source (read from its config.json: a local directory, or the hub's
    copy of that one file), so the training config matches the imported checkpoint."""
    from transformers import AutoConfig

    from mlmclm.convert.hf_config import model_config_from_hf

    path = Path(source)
    if not path.is_dir():
        if path.exists() or source.startswith((".", "/")) or source.count("/") != 1:
            raise ValueError(f"source {source}: not a model directory (and not a hub name like 'org/model')")
    try:
        hf = AutoConfig.from_pretrained(source, trust_remote_code=False)
    except Exception as err:  # offline hub name, unreadable config: one line
        raise ValueError(f"source {source}: its config.json cannot be read: {type(err).__name__}: {err}") from None
    return model_config_from_hf(hf, path.name, make_vocab_divisible_by).model


def detour_plan(source: str, data_path: str, root: str, *, steps: int, clm_share: float = CLM_SHARE,
                mask_ratio: float = MASK_RATIO, lr: float = LEARNING_RATE, global_batch_size: int,
                nodes: int, gpus_per_node: int, max_micro_batch: int, seq_length: int | None,
                random_length: tuple[int, int] | None, tokenizer: str | None, fp8: bool, seed: int,
                layout: ParallelConfig | None = None, validation_samples: int | None = None,
                model: ModelConfig | None = None) -> DetourPlan:
    """The family's one builder (paper scale and CPU twin choose its arguments)."""
    if not 0 < clm_share < 1:
        raise ValueError(f"clm_share must be strictly between 0 and 1, got {clm_share}")
    clm_steps = round(steps * clm_share)
    if not 0 < clm_steps < steps:
        raise ValueError(f"steps={steps} with clm_share={clm_share} leaves no CLM or no MLM step")
    model = model or source_model(source)
    if seq_length is not None and seq_length > model.max_position_embeddings:
        raise ValueError(f"seq_length {seq_length} exceeds the source's max_position_embeddings "
                         f"{model.max_position_embeddings}")
    root_path = Path(root)
    imported = root_path / "imported"
    warmup = max(1, round(steps * WARMUP_SHARE))
    decay = steps - clm_steps  # the WSD decay is the MLM phase (the detour's second phase; the control's last steps)
    if warmup > clm_steps:
        raise ValueError(f"the warmup ({warmup} steps) must end before the decay starts at step {clm_steps}")

    def partial(name: str, phases: list[Phase]) -> run.Partial:
        built = train_partial(
            model=model, layout=layout or ParallelConfig(), phases=phases, total_steps=steps,
            global_batch_size=global_batch_size, nodes=nodes, gpus_per_node=gpus_per_node, data_path=data_path,
            run_dir=str(root_path / name), tokenizer=tokenizer, warmup_steps=warmup, decay_steps=decay, lr=lr,
            init_from=str(imported), fp8=fp8, max_micro_batch=max_micro_batch, save_interval=None,
            log_interval=max(1, steps // 10), seed=seed, random_length=random_length,
            validation_interval=clm_steps)  # at the switch (both runs) and at the end
        if validation_samples is not None:
            built.config.validation.samples = validation_samples
        validate(built)
        return built

    detour = partial("detour", [Phase("clm", steps=clm_steps), Phase("mlm", steps=steps - clm_steps,
                                                                     mask_ratio=mask_ratio)])
    control = partial("control", [Phase("mlm", steps=steps, mask_ratio=mask_ratio)])
    return DetourPlan(source, root_path, imported, detour, control, clm_steps, gpus_per_node)


def detour_eurobert(source: str, data_path: str, root: str, steps: int = 10_000, clm_share: float = CLM_SHARE,
                    mask_ratio: float = MASK_RATIO, lr: float = LEARNING_RATE, nodes: int = 1,
                    gpus_per_node: int = 8, seed: int = 1234, fp8: bool = True) -> DetourPlan:
    """Paper scale on H100 nodes: the paper's 2304 random-length samples (12-2048 tokens) a step, DP only (TP/PP 1:
    EuroBERT 210m/610m fit one GPU, as base.SIZES sizes them), FP8 hybrid. Not run on a GPU here."""
    return detour_plan(source, data_path, root, steps=steps, clm_share=clm_share, mask_ratio=mask_ratio, lr=lr,
                       global_batch_size=PAPER_GLOBAL_BATCH, nodes=nodes, gpus_per_node=gpus_per_node,
                       max_micro_batch=12, seq_length=None, random_length=PAPER_SAMPLE_LENGTHS, tokenizer=None,
                       fp8=fp8, seed=seed)


def tiny_detour(source: str, data_path: str, root: str, steps: int = 8, clm_share: float = CLM_SHARE,
                mask_ratio: float = MASK_RATIO, lr: float = 1e-3, processes: int = 2, seed: int = 1234,
                validation_samples: int | None = 16) -> DetourPlan:
    """The CPU twin: a tiny EuroBERT (`make_tiny_eurobert`), the demo's packed rows of 128 tokens, 8 per step."""
    return detour_plan(source, data_path, root, steps=steps, clm_share=clm_share, mask_ratio=mask_ratio, lr=lr,
                       global_batch_size=8, nodes=1, gpus_per_node=processes, max_micro_batch=2, seq_length=128,
                       random_length=None, tokenizer=None, fp8=False, seed=seed,
                       validation_samples=validation_samples)


def make_tiny_eurobert(directory: Path, seed: int = 0) -> Path:
    """A random tiny EuroBERT (the `tiny` preset's shape) made with `transformers`, saved with the embedded demo
    tokenizer, so the demo's corpus is its domain data. Written only where nothing is."""
    import shutil

    import torch
    from transformers import AutoTokenizer, EuroBertConfig, EuroBertForMaskedLM

    from mlmclm.data.tokenizer import embedded_tokenizer_dir

    directory = Path(directory)
    if (directory / "config.json").exists():
        return directory
    if directory.exists() and any(directory.iterdir()):
        raise ValueError(f"{directory} is not empty and holds no model: refusing to write a tiny EuroBERT into it")
    tokenizer = AutoTokenizer.from_pretrained(str(embedded_tokenizer_dir()), trust_remote_code=False)
    torch.manual_seed(seed)
    config = EuroBertConfig(vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=256, max_position_embeddings=1024,
                            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=tokenizer.pad_token_id, mask_token_id=tokenizer.mask_token_id,
                            tie_word_embeddings=False)
    staging = directory.with_name(f".{directory.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    EuroBertForMaskedLM(config).save_pretrained(str(staging))
    tokenizer.save_pretrained(str(staging))
    if directory.exists():
        directory.rmdir()  # empty (checked above)
    staging.replace(directory)
    return directory


def import_and_measure(source: str, imported: str, config_json: str, out: str, processes: int = 1) -> dict:
    """The `import` task: convert the source (weights only; reused when already converted from the same source)
    and measure its held-out losses with the training runs' validation (step 0)."""
    import logging

    from mlmclm.convert.from_hf import ImportConfig, convert_from_hf
    from mlmclm.train import checkpoint as ckpt
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
