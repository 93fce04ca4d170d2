"""What a unit costs: model FLOPs from the encoder's shape (`mlmclm.flops`, the function `recipes.sweep --plan`
prices pretraining with), device-hours at a stated MFU, and the wall time on K devices.

A fine-tuning step of B rows of L tokens costs `flops_per_token(shape, L) x L x B` (forward + backward; no LM head:
the task heads are a few hidden x labels products, not counted). Evaluation is forward only. Row lengths come from
the data when it is at hand (`tokens_of`: characters / CHARS_PER_TOKEN over a sample, capped at the task's length),
else from an assumed length per task (`grid --list` says which).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from mlmclm import flops

# Model FLOPs utilisation assumed for fine-tuning when pricing a suite (not measured here: micro-batches of 4 short
# rows keep a GPU far below pretraining's utilisation; the GPU session's finetune section measures steps/s).
DEFAULT_MFU = 0.15
DEFAULT_PEAK = "H100"
CHARS_PER_TOKEN = 4.0  # English text under a byte-level BPE of ~128k entries (EuroBERT's): an estimate, not a count
LENGTH_SAMPLE = 256  # rows whose characters are counted per split


@dataclass(frozen=True)
class EncoderShape:
    """The fields `mlmclm.flops` reads, from a Hugging Face config.json (EuroBERT / Llama names)."""

    hidden_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int

    def padded_vocab_size(self, tensor_parallel: int) -> int:
        return 0  # fine-tuning runs no LM head

    @classmethod
    def from_hf_config(cls, config: dict) -> EncoderShape:
        heads = config["num_attention_heads"]
        return cls(hidden_size=config["hidden_size"], num_layers=config["num_hidden_layers"],
                   num_kv_heads=config.get("num_key_value_heads") or heads,
                   head_dim=config.get("head_dim") or config["hidden_size"] // heads,
                   ffn_hidden_size=config["intermediate_size"])

    @classmethod
    def of_model_dir(cls, model_dir: Path) -> EncoderShape:
        return cls.from_hf_config(json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8")))

    @classmethod
    def of_model_config(cls, model) -> EncoderShape:
        """From an `mlmclm.model.config.ModelConfig` (the paper's named sizes)."""
        return cls(model.hidden_size, model.num_layers, model.num_kv_heads, model.head_dim, model.ffn_hidden_size)


def training_flops(shape: EncoderShape, steps: int, rows_per_step: int, tokens_per_row: float) -> float:
    length = max(1, round(tokens_per_row))
    return flops.flops_per_token(shape, length, vocab_size=0) * length * rows_per_step * steps


def forward_flops(shape: EncoderShape, rows: int, tokens_per_row: float) -> float:
    length = max(1, round(tokens_per_row))
    return flops.flops_per_token(shape, length, training=False, vocab_size=0) * length * rows


def tokens_of(texts: list[str], max_length: int | None) -> float:
    """Estimated mean tokens per text over the first LENGTH_SAMPLE texts (characters / CHARS_PER_TOKEN + 1 for the
    EOS), capped at `max_length`."""
    sample = texts[:LENGTH_SAMPLE]
    if not sample:
        return 0.0
    mean = sum(len(t) for t in sample) / len(sample) / CHARS_PER_TOKEN + 1
    return min(mean, max_length) if max_length else mean


def device_hours(total_flops: float, mfu: float = DEFAULT_MFU, peak: str = DEFAULT_PEAK) -> float:
    if not 0 < mfu <= 1:
        raise ValueError(f"--mfu must be in (0, 1], got {mfu}")
    return total_flops / (mfu * flops.peak_flops("bf16", peak)) / 3600


def wall_hours(unit_hours: list[float], devices: int) -> float:
    """Longest units first onto the least loaded of `devices` (what the workers do): the last one's end."""
    if devices < 1:
        raise ValueError(f"--gpus must be >= 1, got {devices}")
    loads = [0.0] * devices
    for hours in sorted(unit_hours, reverse=True):
        loads[loads.index(min(loads))] += hours
    return max(loads) if unit_hours else 0.0


def hours_text(hours: float) -> str:
    if not math.isfinite(hours):
        return "?"
    return f"{hours * 60:.1f} min" if hours < 1 else f"{hours:,.1f} h"
