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
    """The fields `mlmclm.flops` reads, from a Hugging Face config.json (EuroBERT / Llama names, or ModernBERT's:
    its local layers see a window of `local_attention` tokens, which the attention FLOPs count)."""

    hidden_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    layer_is_local: tuple[bool, ...] = ()  # per layer, ModernBERT; empty: every layer attends to the whole row
    local_attention: int | None = None

    # No MLM head in fine-tuning: ModernBERT's head transform is not run (flops.flop_breakdown reads this).
    is_modernbert = False

    def padded_vocab_size(self, tensor_parallel: int) -> int:
        return 0  # fine-tuning runs no LM head

    def local_layers(self) -> list[bool]:
        return list(self.layer_is_local) or [False] * self.num_layers

    @property
    def half_window(self) -> int | None:
        return None if self.local_attention is None else self.local_attention // 2

    @classmethod
    def from_hf_config(cls, config: dict) -> EncoderShape:
        heads, layers = config["num_attention_heads"], config["num_hidden_layers"]
        local, window = (), None
        if config.get("model_type") == "modernbert":
            if isinstance(config.get("layer_types"), list):  # transformers >= 5 writes each layer's kind
                local = tuple(kind == "sliding_attention" for kind in config["layer_types"])
            else:  # a global layer every `global_attn_every_n_layers`, from layer 0
                every = config.get("global_attn_every_n_layers") or 1
                local = tuple(index % every != 0 for index in range(layers))
            window = config.get("local_attention") if any(local) else None
        return cls(hidden_size=config["hidden_size"], num_layers=layers,
                   num_kv_heads=config.get("num_key_value_heads") or heads,
                   head_dim=config.get("head_dim") or config["hidden_size"] // heads,
                   ffn_hidden_size=config["intermediate_size"], layer_is_local=local, local_attention=window)

    @classmethod
    def of_model_dir(cls, model_dir: Path) -> EncoderShape:
        return cls.from_hf_config(json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8")))

    @classmethod
    def of_model_config(cls, model) -> EncoderShape:
        """From an `mlmclm.model.config.ModelConfig` (the paper's named sizes, or a ModernBERT shape)."""
        return cls(model.hidden_size, model.num_layers, model.num_kv_heads, model.head_dim, model.ffn_hidden_size,
                   tuple(model.local_layers()), model.local_attention if model.is_modernbert else None)


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
