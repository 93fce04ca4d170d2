"""What a resume may change: a run continues exactly only if everything that shapes its numbers is unchanged.

Free to change on resume (they do not change what is computed, or change it only by float reassociation):
the parallel layout (TP/PP/VPP/CP/DP, sequence parallel, distributed optimizer, overlapped gradient reduction and
parameter gather), the micro-batch size, logging, checkpointing (interval, pruning), the run and data locations, the
TE/local layer choice, the non-finite guard, the garbage-collection interval, the sparse MLM head and the fused
kernels (same mathematics, other rounding).
Everything else — seeds, batch and run length, phases and objectives, schedule, optimizer, model, precision —
is refused naming the field, unless listed in `checkpoint.allow_resume_changes` (dotted prefixes, e.g.
`[total_steps, phases, schedule]` to extend a run), which makes the change deliberate and logs it.
"""
from __future__ import annotations

import logging
import re
from pathlib import Path

from mlmclm.data.manifest import Manifest
from mlmclm.model.config import ModelConfig
from mlmclm.train import checkpoint_files as ckpt
from mlmclm.train.config import PHASE_MODEL_FIELDS, TrainConfig

log = logging.getLogger(__name__)

FREE_ON_RESUME = ("run_dir", "data.path", "data.tokenizer", "data.skip_corrupt", "parallel", "micro_batch_size",
                  "checkpoint", "logging", "use_te", "max_consecutive_nonfinite", "manual_gc_interval",
                  "sparse_mlm_head", "head_chunk_tokens", "fused_kernels", "optimizer.distributed_optimizer",
                  "optimizer.overlap_grad_reduce", "optimizer.overlap_param_gather", "deterministic",
                  "model.name", "validation")

_SHAPE_FIELDS = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads", "ffn_hidden_size",
                 "vocab_size", "norm_eps", "architecture", "layer_types", "local_attention")
# what a checkpoint saved before a field existed holds: that field's default (EuroBERT's)
_SHAPE_DEFAULTS = {"architecture": "eurobert", "layer_types": None, "local_attention": None}


class IncompatibleCheckpointError(ValueError):
    pass


def check_same_shape(saved: dict, model: ModelConfig, where: str) -> None:
    """Weights from `saved` (a checkpoint's model config) fit `model` (continued pretraining)."""
    for name in _SHAPE_FIELDS:
        if saved.get(name, _SHAPE_DEFAULTS.get(name)) != getattr(model, name):
            raise IncompatibleCheckpointError(
                f"{where}: model.{name} is {saved.get(name, _SHAPE_DEFAULTS.get(name))!r} in the checkpoint but "
                f"{getattr(model, name)!r} in this config")


def _flatten(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}{key}."))
        return out
    if isinstance(value, list) and any(isinstance(item, dict) for item in value):
        out = {f"{prefix}length": len(value)}
        for index, item in enumerate(value):
            out.update(_flatten(item, f"{prefix}{index}."))
        return out
    return {prefix[:-1]: value}


def _covered(field: str, prefixes) -> bool:
    # a phase's own data follows the run's data rules (its location may move, like data.path)
    as_run_data = re.sub(r"^phases\.\d+\.data\.", "data.", field)
    return any(f == p or f.startswith(p + ".") for p in prefixes for f in {field, as_run_data})


def changed_fields(saved_config: dict, config: dict) -> dict[str, tuple]:
    """Dotted field → (checkpoint value, this config's value) for every field present in both that differs."""
    old, new = _flatten(saved_config), _flatten(config)
    return {k: (old[k], new[k]) for k in sorted(old.keys() & new.keys()) if old[k] != new[k]}


def check_resume_compatible(saved_config: dict, saved_state: dict, config: dict, allowed: list[str],
                            manifest: Manifest, where: str) -> None:
    """Raise `IncompatibleCheckpointError` naming the first change that would make the resume inexact."""
    check_same_data_identity(saved_state, manifest, where)
    check_same_settings(saved_config, config, allowed, where)


def check_same_settings(saved_config: dict, config: dict, allowed: list[str], where: str,
                        finished: bool = False) -> None:
    """Every setting that shapes the run's numbers is the checkpoint's, or changed by `allowed` — except for a
    `finished` run, which no resume continues: there an allowed change would only lead to "nothing to train"."""
    refused = {}
    for field, (old, new) in changed_fields(saved_config, config).items():
        if _covered(field, FREE_ON_RESUME):
            continue
        if _covered(field, allowed) and not finished:
            log.warning("resume: %s changed from %r to %r (allowed by checkpoint.allow_resume_changes)", field, old,
                        new)
            continue
        refused[field] = (old, new)
    if refused:  # all of them at once: allowing one must not lead into a second refusal
        raise IncompatibleCheckpointError(_settings_refusal(where, refused, finished))


def _settings_refusal(where: str, refused: dict[str, tuple], finished: bool) -> str:
    changes = "; ".join(f"{field} is {old!r} in the checkpoint but {new!r} here" for field, (old, new) in
                        refused.items())
    seeds = [field for field in refused if field.rpartition(".")[2] == "seed"]
    if finished or seeds:  # no resume is the way forward: another seed, or any change to a finished run, is a new run
        why = "This run is finished, so a changed setting" if finished else "A different seed"
        return f"{where}: {changes}. {why} is a new run: give it a new run_dir (run_dir=...)"
    return (f"{where}: {changes}; resuming would not continue the same run. To change it on purpose, allow it: "
            f"checkpoint.allow_resume_changes=[{','.join(refused)}]")


def check_rope_in_force(saved_state: dict, model: ModelConfig, where: str) -> None:
    """The RoPE θ and context the checkpoint was trained with are what this config has in force at its step
    (`model`: this config's phase model there); checkpoints from before per-phase θ record none."""
    for name in PHASE_MODEL_FIELDS:
        saved = saved_state.get(name)
        if saved is not None and saved != getattr(model, name):
            raise IncompatibleCheckpointError(
                f"{where}: {name} {saved!r} was in force at the checkpoint's step {saved_state.get('iteration')}, "
                f"but this config's phases put {getattr(model, name)!r} there (model.{name}, phases[].{name})")


def check_same_data_identity(saved_state: dict, manifest: Manifest, where: str) -> None:
    """The checkpoint was trained on data with this tokenizer and sequence length."""
    saved_tok = saved_state.get("tokenizer", {})
    if saved_tok.get("vocab_hash") != manifest.tokenizer.get("vocab_hash"):
        raise IncompatibleCheckpointError(
            f"{where}: tokenizer.vocab_hash differs: checkpoint {saved_tok.get('name')!r} "
            f"({str(saved_tok.get('vocab_hash'))[:12]}) vs data {manifest.tokenizer.get('name')!r} "
            f"({str(manifest.tokenizer.get('vocab_hash'))[:12]})")
    if saved_state.get("seq_length") != manifest.seq_length:
        raise IncompatibleCheckpointError(
            f"{where}: seq_length is {saved_state.get('seq_length')} in the checkpoint but {manifest.seq_length} "
            f"in the data")


def check_resume_from(cfg: TrainConfig, checkpoint: Path, manifest: Manifest | None) -> dict:
    """Everything a resume of `cfg` from `checkpoint` checks before loading a tensor: its data identity (against
    `manifest`; None where the data cannot be read from here, as for a launcher before a remote run), its settings
    and the RoPE θ and context in force at its step. The same checks guard a resume and a finished run's re-launch
    (recipes.launch): a changed setting is refused, never ignored. Returns the checkpoint's train state."""
    saved_config = ckpt.read_json(checkpoint, ckpt.RUN_CONFIG)
    saved_state = ckpt.read_json(checkpoint, ckpt.TRAIN_STATE)
    if manifest is not None:
        check_same_data_identity(saved_state, manifest, str(checkpoint))
    iteration = saved_state.get("iteration")
    finished = isinstance(iteration, int) and iteration >= cfg.total_steps  # (a finished run's re-launch)
    check_same_settings(saved_config, cfg.to_dict(), cfg.checkpoint.allow_resume_changes, str(checkpoint), finished)
    last_step = min(saved_state["iteration"], cfg.total_steps) - 1  # the checkpoint's last trained step
    check_rope_in_force(saved_state, cfg.phase_models()[cfg.phase_at(last_step)], str(checkpoint))
    return saved_state
