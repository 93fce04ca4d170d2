"""Export a megatron dist checkpoint (any TP/PP/VPP/DP layout) as a native Hugging Face EuroBERT or ModernBERT
directory (`EuroBertForMaskedLM`, `ModernBertForMaskedLM`: no remote code).

Tensors are streamed: each one is read from the torch_dist files (only its own saved chunks), split by the
mapping table, cast, and written straight into safetensors; memory holds about one tensor, not the model.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from mlmclm.convert.dist_reader import CheckpointReadError, DistCheckpointReader
from mlmclm.convert.architecture_config import HF_CLASSES, hf_config, rope_parameters
from mlmclm.convert.output import SafetensorsStreamWriter, check_output, dir_size, staged_output
from mlmclm.convert.remote_code_hooks import strip_remote_code_hooks
from mlmclm.convert.verify import DEFAULT_VERIFY_LENGTH, VerificationError, verify_export
from mlmclm.export.sentence_transformers import SentenceTransformerLayout, write_sentence_transformer_files
from mlmclm.model.config import ModelConfig
from mlmclm.output_apart import check_output_apart
from mlmclm.model.architectures import mapping_table
from mlmclm.model.hf_mapping import COLUMNS, GATE_UP, QKV, REPLICATED, ROWS, iter_mappings, megatron_to_hf
from mlmclm.train import checkpoint as ckpt
from mlmclm.train.config import PHASE_MODEL_FIELDS

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TOKENIZER_SUBDIR = "tokenizer"  # a checkpoint may carry its tokenizer (convert_from_hf writes one)


@dataclass
class ExportConfig:
    checkpoint: Path  # run dir (latest checkpoint), checkpoints dir, or iter_* dir
    output: Path
    dtype: str = "fp32"  # "fp32" | "bf16"
    force: bool = False  # replace an existing output directory
    verify: bool = False  # compare HF logits with ours before publishing the output
    tolerance: float = 1e-4  # max abs logit difference --verify accepts (fp32 math, different op order)
    tokenizer: str | None = None  # override the run's tokenizer (local dir, hub name, or "embedded")
    verify_length: int = DEFAULT_VERIFY_LENGTH  # tokens per sequence --verify compares (at most max positions)
    max_shard_bytes: int = 5 * 2**30  # HF's default shard size
    progress: bool = True
    # also write the sentence-transformers files (mlmclm/export/sentence_transformers.py) into the output
    sentence_transformers: SentenceTransformerLayout | None = None

    def __post_init__(self):
        self.checkpoint, self.output = Path(self.checkpoint), Path(self.output)
        if self.dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype must be one of {sorted(TORCH_DTYPES)}, got {self.dtype!r}")
        if isinstance(self.verify_length, bool) or not isinstance(self.verify_length, int) or self.verify_length < 1:
            raise ValueError(f"verify_length must be an integer >= 1, got {self.verify_length!r}")
        if self.max_shard_bytes < 1:
            raise ValueError("max_shard_bytes must be >= 1")


@dataclass
class ExportSummary:
    checkpoint: str
    output: str
    num_parameters: int
    dtype: str
    source_layout: dict
    iteration: int | None
    consumed_tokens: int | None
    seconds: float
    output_bytes: int
    files: list[str] = field(default_factory=list)
    max_abs_diff: float | None = None

    def text(self) -> str:
        lines = [f"exported {self.checkpoint}", f"  -> {self.output}",
                 f"  parameters: {self.num_parameters:,}  dtype: {self.dtype}  source layout: {self.source_layout}",
                 f"  iteration: {self.iteration}  tokens seen: {self.consumed_tokens}",
                 f"  files: {', '.join(self.files)}",
                 f"  output size: {self.output_bytes / 2**20:.1f} MiB  time: {self.seconds:.1f} s"]
        if self.max_abs_diff is not None:
            lines.append(f"  verify: max |logits HF - ours| = {self.max_abs_diff:.3e}")
        return "\n".join(lines)


# --- reading and checking the checkpoint ------------------------------------------------------------------------

@dataclass
class SourceCheckpoint:
    path: Path
    run_config: dict
    train_state: dict
    model: ModelConfig


def open_checkpoint(path: Path) -> SourceCheckpoint:
    """Resolve and sanity-check a checkpoint; raise CheckpointError naming what is wrong."""
    resolved = ckpt.resolve_checkpoint(path)
    meta = ckpt.read_json(resolved, "metadata.json")
    if meta.get("sharded_backend") != "torch_dist":
        raise ckpt.CheckpointError(f"{resolved}: sharded backend {meta.get('sharded_backend')!r} is not supported "
                                   f"(only torch_dist checkpoints are)")
    try:
        run_config = ckpt.read_json(resolved, ckpt.RUN_CONFIG)
        train_state = ckpt.read_json(resolved, ckpt.TRAIN_STATE)
    except json.JSONDecodeError as err:
        raise ckpt.CheckpointError(f"{resolved}: unreadable JSON: {err}") from err
    if not isinstance(run_config.get("model"), dict):
        raise ckpt.CheckpointError(f"{resolved}/{ckpt.RUN_CONFIG} has no `model` section")
    try:
        # the RoPE θ and context in force at the checkpoint's step: a phase may have raised them (TrainConfig.phases)
        in_force = {name: train_state[name] for name in PHASE_MODEL_FIELDS if train_state.get(name) is not None}
        model = ModelConfig.from_dict({**run_config["model"], **in_force})
    except (TypeError, ValueError) as err:
        raise ckpt.CheckpointError(f"{resolved}/{ckpt.RUN_CONFIG}: invalid model config: {err}") from err
    return SourceCheckpoint(resolved, run_config, train_state, model)


def expected_shape(name: str, split: str, cfg: ModelConfig) -> tuple:
    """Full (TP=1) shape of a megatron tensor; None in place of the padded vocabulary size."""
    h, d = cfg.hidden_size, cfg.head_dim
    if split == REPLICATED:
        return (h, h) if name.endswith("head_dense") else (h,)  # ModernBERT's head dense layer is replicated
    if split == ROWS:
        return (None,) if name.endswith(".bias") else (None, h)
    if split == QKV:
        return ((cfg.num_attention_heads + 2 * cfg.num_kv_heads) * d, h)
    if split == GATE_UP:
        return (2 * cfg.ffn_hidden_size, h)
    if split == COLUMNS:
        return (h, cfg.ffn_hidden_size) if "linear_fc2" in name else (h, cfg.num_attention_heads * d)
    raise ValueError(split)


def check_tensors(reader: DistCheckpointReader, cfg: ModelConfig) -> None:
    """Every tensor of the model is in the checkpoint with the shape the saved config says."""
    for name, _, split in iter_mappings(cfg.num_layers, mapping_table(cfg)):
        try:
            shape = reader.shape(name)
        except CheckpointReadError as err:
            raise CheckpointReadError(f"{err} (the checkpoint does not match its saved model config, or was saved "
                                      f"with an unsupported layer spec)") from None
        want = expected_shape(name, split, cfg)
        vocab_ok = want[0] is not None or shape[0] >= cfg.vocab_size
        if len(shape) != len(want) or not vocab_ok or any(w is not None and w != s for w, s in zip(want, shape)):
            raise CheckpointReadError(f"{reader.path}: {name} has shape {shape}, the saved model config implies "
                                      f"{tuple('vocab' if w is None else w for w in want)}")
    saved_layers = reader.saved_layers()
    if saved_layers != cfg.num_layers:
        raise CheckpointReadError(f"{reader.path}: {saved_layers} layers saved, the config says {cfg.num_layers}")


# --- tokenizer and model card ------------------------------------------------------------------------------------

def resolve_tokenizer(source: SourceCheckpoint, override: str | None):
    """The run's tokenizer, checked against the identity saved with the checkpoint."""
    from mlmclm.data.tokenizer import load_tokenizer, tokenizer_identity

    carried = source.path / TOKENIZER_SUBDIR
    name = override or (str(carried) if carried.is_dir() else (source.run_config.get("data") or {}).get("tokenizer"))
    if not name:
        raise ckpt.CheckpointError(f"{source.path}: the run config names no tokenizer (data.tokenizer); pass one "
                                   f"with --tokenizer")
    try:
        tok = load_tokenizer(name)
    except Exception as err:  # missing dir, no network for a hub name, broken files
        raise ckpt.CheckpointError(f"cannot load the tokenizer {name!r}: {type(err).__name__}: {err}") from err
    identity = tokenizer_identity(tok)
    saved = source.train_state.get("tokenizer") or {}
    if saved.get("vocab_hash") and saved["vocab_hash"] != identity["vocab_hash"]:
        raise ckpt.CheckpointError(
            f"tokenizer {name!r} is not the one the checkpoint was trained with (vocab_hash "
            f"{identity['vocab_hash'][:12]} != saved {saved['vocab_hash'][:12]})")
    if identity["vocab_size"] > source.model.vocab_size:
        raise ckpt.CheckpointError(f"tokenizer {name!r} has {identity['vocab_size']} tokens, more than the model's "
                                   f"vocabulary {source.model.vocab_size}")
    return tok, identity, name


def mask_absorbs_space(tok) -> None:
    """Make the mask token take the space before it, as RoBERTa's `<mask>` does (`lstrip`).

    A byte-level BPE puts a word's leading space inside the word's token ("Ġwinter"); training masks such tokens, so
    the model predicts "Ġwinter" at a mask. With the mask as added by default, "of our <|mask|>." tokenizes as
    'Ġour', 'Ġ', '<|mask|>': a lone-space token the model never saw before a mask, and fill-mask's first guess was a
    newline. Only text with the mask token in it tokenizes differently; ids and the vocabulary are unchanged.
    (EuroBERT's own tokenizer file could not be read here to compare; its documentation queries as "create <|mask|>
    through", the form this makes work.)"""
    from tokenizers import AddedToken

    if tok.mask_token is None:
        return
    tok.add_special_tokens({"mask_token": AddedToken(str(tok.mask_token), lstrip=True, rstrip=False,
                                                     normalized=False, special=True)})


def _phases(run_config: dict) -> list[dict]:
    return [p for p in run_config.get("phases") or [] if isinstance(p, dict)]


def model_card(source: SourceCheckpoint, tokenizer_name: str, dtype: str) -> str:
    rc, ts, m = source.run_config, source.train_state, source.model
    run = Path(rc.get("run_dir") or source.path.parent.parent).name
    phases = _phases(rc)
    total = rc.get("total_steps")
    rows = []
    for i, p in enumerate(phases):
        kind = (p.get("objective") or {}).get("kind", "?")
        length = f"{p['steps']} steps" if p.get("steps") else f"{p.get('fraction')} of {total} steps"
        raised = ", ".join(f"{label} {p[key]:g}" for key, label in (("rope_theta", "RoPE θ"),
                                                                  ("max_position_embeddings", "context"))
                           if p.get(key) is not None)
        rows.append(f"| {i} | {p.get('name') or kind} | {kind.upper()} | {length}{'; ' + raised if raised else ''} |")
    kinds = {(p.get("objective") or {}).get("kind") for p in phases}
    converted = rc.get("converted_from")
    family = {"eurobert": "EuroBERT", "modernbert": "ModernBERT"}[m.architecture]
    windows = (f"; {m.layer_types.count('local')} local layers (window {m.local_attention}, RoPE θ "
               f"{m.local_rope_theta:g})" if m.is_modernbert else "")
    lines = [
        "---", "library_name: transformers", "pipeline_tag: fill-mask", f"tags: [{m.architecture}, mlmclm]", "---",
        "", f"# {run} — iteration {ts.get('iteration')}", "",
        f"{family}-architecture encoder exported from the mlmclm checkpoint `{source.path.name}` of run `{run}`.", "",
        f"- shape: {m.num_layers} layers, hidden {m.hidden_size}, {m.num_attention_heads} heads "
        f"({m.num_kv_heads} KV), FFN {m.ffn_hidden_size}, vocabulary {m.vocab_size}{windows}",
        f"- RoPE: {json.dumps(rope_parameters(m))}, max positions {m.max_position_embeddings}",
        f"- steps: {ts.get('iteration')} of {total}; tokens seen: {ts.get('consumed_tokens')}",
        f"- phase at this checkpoint: {ts.get('phase_name')} (index {ts.get('phase_index')})",
        f"- tokenizer: `{Path(str(tokenizer_name)).name}`; weights: {dtype}",
        f"- training layout: {ts.get('layout')}",
    ]
    if converted:
        lines.append(f"- converted from Hugging Face: `{json.dumps(converted, sort_keys=True)}`")
    branched = ts.get("branched_from")
    if isinstance(branched, dict):  # mlmclm.train.branch: the steps up to the branch point are the parent's
        lines.append(f"- branched at step {branched.get('step')} from `{branched.get('checkpoint')}` (its full state; "
                     f"this run's own plan after that step)")
    if rows:
        lines += ["", "## Objective phases", "", "| # | name | objective | length |", "|---|---|---|---|", *rows]
    held_out = [v for v in ts.get("validation") or [] if isinstance(v, dict)]
    if held_out:  # mlmclm.train.validation: both objectives on the same held-out samples, whatever was trained
        ratio = (rc.get("validation") or {}).get("mask_ratio")
        lines += ["", "## Validation (held-out documents)", "",
                  f"CLM loss and MLM loss at mask ratio {ratio} (nats per predicted token), on the same held-out "
                  "samples at every evaluation:", "",
                  "| step | tokens | CLM loss | MLM loss |", "|---|---|---|---|",
                  *(f"| {v.get('step')} | {v.get('tokens')} | {v.get('val/clm/loss', float('nan')):.4f} | "
                    f"{v.get('val/mlm/loss', float('nan')):.4f} |" for v in held_out)]
    if "clm" in kinds or (converted and converted.get("model_type") == "llama"):
        lines += ["", "Part of this model's training used a causal (CLM) objective. It is exported, like every "
                      f"checkpoint, as a bidirectional {family} encoder: Hugging Face's `{HF_CLASSES[m.architecture]}` "
                      "attends in both directions, which is how CLM-trained checkpoints are fine-tuned (the EuroBERT "
                      "paper, the CLM detour)."]
    lines += ["", "Load with `AutoModelForMaskedLM.from_pretrained(path)` and `AutoTokenizer.from_pretrained(path)` "
                  "(no remote code).", ""]
    return "\n".join(lines)


# --- export ------------------------------------------------------------------------------------------------------

def run_of(checkpoint: Path) -> Path:
    """The run directory a checkpoint path belongs to (RUN, RUN/checkpoints or RUN/checkpoints/iter_* given)."""
    path = Path(checkpoint).absolute()
    if path.name.startswith("iter_") and path.parent.name == "checkpoints":
        return path.parent.parent
    return path.parent if path.name == "checkpoints" else path


def convert_to_hf(cfg: ExportConfig) -> ExportSummary:
    start = time.time()
    check_output_apart(cfg.output, {"training run": run_of(cfg.checkpoint), "tokenizer": cfg.tokenizer})
    source = open_checkpoint(cfg.checkpoint)
    check_output(cfg.output, cfg.force)  # fail before any work
    tok, identity, tok_name = resolve_tokenizer(source, cfg.tokenizer)
    reader = DistCheckpointReader(source.path)
    check_tensors(reader, source.model)
    model = source.model
    dtype = TORCH_DTYPES[cfg.dtype]
    # The mapping on meta tensors gives every HF name and shape, in write order, without reading data.
    table = mapping_table(model)
    plan = [(n, tuple(t.shape)) for n, t in megatron_to_hf(
        lambda name: torch.empty(reader.shape(name), device="meta"), model, table)]
    with staged_output(cfg.output, cfg.force) as staging:
        writer = SafetensorsStreamWriter(staging, plan, dtype, cfg.max_shard_bytes)
        tensors = megatron_to_hf(reader.read, model, table)
        for name, tensor in tqdm(tensors, total=len(plan), desc="export", unit="tensor", disable=not cfg.progress):
            if not bool(torch.isfinite(tensor).all()):  # a NaN model computes nothing: never published as one
                raise CheckpointReadError(f"{source.path}: tensor {name} holds NaN or infinity: refusing to export "
                                          f"a model that cannot compute (nothing was written to {cfg.output})")
            writer.write(name, tensor)
        files = writer.close()
        hf_config(model, identity, cfg.dtype).save_pretrained(str(staging))
        mask_absorbs_space(tok)
        if cfg.sentence_transformers is not None and tok.pad_token is None:
            tok.pad_token = tok.eos_token  # sentence-transformers pads; our evaluation pads with the EOS so too
        tok.save_pretrained(str(staging))
        if cfg.sentence_transformers is not None:
            write_sentence_transformer_files(staging, cfg.sentence_transformers)
        strip_remote_code_hooks(staging)  # the tokenizer we loaded saves the source's auto_map back out
        (staging / "README.md").write_text(model_card(source, tok_name, cfg.dtype))
        diff = None
        if cfg.verify:
            try:
                diff = verify_export(source.path, staging, model, identity, cfg.dtype, cfg.tolerance,
                                     cfg.verify_length)
            except VerificationError as err:
                raise VerificationError(f"verification of the export to {cfg.output} failed: {err}; nothing was "
                                        f"written there") from None
        size = dir_size(staging)
    return ExportSummary(
        checkpoint=str(source.path), output=str(cfg.output), num_parameters=writer.num_params, dtype=cfg.dtype,
        source_layout=source.train_state.get("layout") or {}, iteration=source.train_state.get("iteration"),
        consumed_tokens=source.train_state.get("consumed_tokens"), seconds=time.time() - start, output_bytes=size,
        files=files, max_abs_diff=diff)


def export_checkpoint(checkpoint_dir: Path, output_dir: Path, *, dtype: str = "fp32", force: bool = False,
                      verify: bool = False, progress: bool = False) -> Path:
    """Export one checkpoint to `output_dir` (native HF model); returns `output_dir`. Used by the evaluation code."""
    convert_to_hf(ExportConfig(checkpoint_dir, output_dir, dtype=dtype, force=force, verify=verify,
                               progress=progress))
    return Path(output_dir)
