"""The resolved training plan of a recipe, in a few readable lines: what a dry-run shows before what it will execute.

Everything is read from the built TrainConfig (the recipe with its overrides, as the ranks will see it), plus the
sequence length from the data's manifest when this machine can read it.
"""
from __future__ import annotations

import json
from pathlib import Path

from mlmclm.train.config import TrainConfig


def _seq_length(cfg: TrainConfig) -> int | None:
    path = cfg.data.path or next(iter(cfg.data.blend or {}), None)
    manifest = Path(str(path)) / "manifest.json" if path else None
    try:
        return int(json.loads(manifest.read_text())["seq_length"]) if manifest else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _mask_rate(objective) -> str:
    if objective.mask_schedule == "constant":
        return f"{objective.mask_ratio:.0%}"
    return f"{objective.mask_ratio:.0%} → {objective.mask_ratio_end:.0%} {objective.mask_schedule}"


def _phases(cfg: TrainConfig) -> str:
    parts = []
    for phase, (start, end) in zip(cfg.phases, cfg.phase_bounds()):
        objective = phase.objective
        what = objective.kind.upper() + (f" (mask {_mask_rate(objective)}, {objective.mask_mode})"
                                         if objective.kind == "mlm" else "")
        raised = [f"{label} {getattr(phase, key):g}" for key, label in (("rope_theta", "RoPE θ"),
                                                                         ("max_position_embeddings", "context"))
                  if getattr(phase, key) is not None]
        if phase.data is not None:
            raised.append(f"data {phase.data.path or phase.data.blend}"
                          + (f" (random lengths {phase.data.random_length.min_length}–"
                             f"{phase.data.random_length.max_length})" if phase.data.random_length else ""))
        parts.append(f"{phase.name}: {what}, steps {start + 1}–{end}" + "".join(f", {r}" for r in raised))
    return "; ".join(parts)


def _schedule(cfg: TrainConfig) -> str:
    opt = cfg.optimizer
    spans = []
    for (start, sched), end in zip(cfg.schedule_spans(), cfg.schedule_span_ends()):
        warmup = f"{sched.warmup_tokens:,} tokens" if sched.warmup_tokens else f"{sched.warmup_steps} steps"
        shape = f"{sched.style}: warmup {warmup}"
        if sched.style == "wsd":
            decay = sched.decay_for(end - start)
            shape += f", stable to step {end - decay}, {sched.decay_shape} decay over the last {decay} steps"
        elif sched.style == "cooldown":
            shape += f", {sched.decay_shape} decay to min over the span"
        spans.append(shape if start == 0 else f"restarted at step {start + 1} (optimizer state kept): {shape}")
    decay = f"weight decay {opt.weight_decay:g}" + (" (decoupled)" if opt.decoupled_weight_decay else "")
    return (f"peak LR {opt.lr:g}, min {opt.min_lr:g}, {'; '.join(spans)}; AdamW β ({opt.beta1:g}, {opt.beta2:g}), "
            f"eps {opt.eps:g}, {decay}, clip {opt.clip_grad:g}")


def _count(n: float) -> str:
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}"


def _every(steps: int) -> str:
    return "every step" if steps == 1 else f"every {steps} steps"


def training_plan(cfg: TrainConfig, world_size: int) -> str:
    model, layout = cfg.model, cfg.parallel
    dp = layout.data_parallel_size(world_size)
    seq = _seq_length(cfg)
    if cfg.data.random_length:
        lengths = cfg.data.random_length
        samples = (f"samples of random length {lengths.min_length}–{lengths.max_length} tokens "
                   f"(≈ {(lengths.min_length + lengths.max_length) / 2:.0f} on average)")
        tokens = (lengths.min_length + lengths.max_length) / 2 * cfg.global_batch_size
    else:
        samples = f"rows of {seq} tokens" if seq else "rows of the data's sequence length (manifest not readable here)"
        tokens = seq * cfg.global_batch_size if seq else None
    per_step = f", ≈ {_count(tokens)} tokens a step, ≈ {_count(tokens * cfg.total_steps)} in all" if tokens else ""
    save = cfg.checkpoint.save_interval
    validation = cfg.validation
    val = ("off" if validation.enabled is False else
           f"{_every(validation.interval)}, at each phase end and at the end (CLM and MLM-"
           f"{validation.mask_ratio:.0%} held-out losses" + (", when the data has a split)" if validation.enabled
                                                              is None else ")"))
    extra = [f"stop after step {cfg.checkpoint.stop_at} (a segment)"] if cfg.checkpoint.stop_at else []
    for name in ("init_from", "branch_from"):
        if value := getattr(cfg.checkpoint, name):
            extra.append(f"{name} {value}" + (f" at step {cfg.checkpoint.branch_step}" if name == "branch_from"
                                              else ""))
    lines = [
        f"model:       {model.name}: {model.num_layers} layers, hidden {model.hidden_size}, "
        f"{model.num_attention_heads} heads ({model.num_kv_heads} KV), FFN {model.ffn_hidden_size}, "
        f"vocab {model.vocab_size}",
        f"layout:      {world_size} ranks = TP {layout.tensor_parallel} × PP {layout.pipeline_parallel} × DP {dp}"
        + (f", VPP {layout.virtual_pipeline_parallel}" if layout.virtual_pipeline_parallel else "")
        + (", sequence parallel" if layout.sequence_parallel else "")
        + f"; precision {cfg.precision.dtype}"
        + (" (bf16 on GPUs, fp32 on CPU)" if cfg.precision.dtype == "auto" else "")
        + (f", FP8 {cfg.precision.fp8}" if cfg.precision.fp8 else ""),
        f"phases:      {cfg.total_steps} steps — {_phases(cfg)}",
        f"batch:       {cfg.global_batch_size} {samples} a step, micro batch {cfg.micro_batch_size} × "
        f"{cfg.num_microbatches(dp)} accumulation × DP {dp}{per_step}",
        f"schedule:    {_schedule(cfg)}",
        f"checkpoints: {_every(save) + ', ' if save else ''}at each phase end and at the end"
        + (f"; {'; '.join(extra)}" if extra else ""),
        f"validation:  {val}",
        f"data:        {cfg.data.path or cfg.data.blend} (tokenizer {cfg.data.tokenizer or 'as its manifest records'}, "
        f"seed {cfg.data.seed})",
        f"run:         {cfg.run_dir} (checkpoints, TensorBoard, metrics.jsonl; resumes from its latest checkpoint)",
    ]
    return "\n".join(lines)
