"""Fine-tuning precision as transformers' Trainer runs EncodEval's `bf16: true` runs.

EncodEval casts the whole model to bf16 (`dtype: torch.bfloat16` in every config, abstract_eval.py) and trains with
`bf16: true`. The Trainer then hands the model to accelerate, whose `Accelerator.prepare_model` (accelerate 1.9.0,
EncodEval's pin) replaces the model's `forward` with one that runs under `torch.autocast(bf16)` and converts the
fp16/bf16 tensors it returns to fp32 (`convert_outputs_to_fp32`). Two consequences:

- a loss computed inside the forward (the SL heads' cross entropy) runs under autocast, which computes cross
  entropy in fp32 on CUDA; ours casts the logits to fp32 itself (encodeval_heads.py), on any device;
- a loss computed from the outputs — sentence-transformers' CachedMNRL: normalisation, similarities, cross
  entropy — runs on fp32 embeddings and outside autocast, so in fp32 throughout (retrieval.py).

The wrapper stays on the model after training, so EncodEval's SC/TC/QA evaluation (same process, same model) also
runs under it; its retrieval evaluation loads the saved model in a fresh process and encodes without it.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

# Fine-tuning precisions: "float32", or "bfloat16" as EncodEval (the whole model cast to bf16, AdamW on the bf16
# weights, the forward under autocast). CPUs run bf16 too.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_LOW = (torch.float16, torch.bfloat16)


def in_precision(model: torch.nn.Module, dtype: str) -> torch.nn.Module:
    """The model, heads included, cast to the run's fine-tuning precision (before the optimizer sees it)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return model.to(DTYPES[dtype])


def outputs_in_fp32(value: Any) -> Any:
    """fp16/bf16 tensors converted to fp32, through tuples, lists and mappings (ModelOutputs included); anything
    else as it is — accelerate's convert_outputs_to_fp32."""
    if isinstance(value, torch.Tensor):
        return value.float() if value.dtype in _LOW else value
    if isinstance(value, Mapping):
        return type(value)(**{key: outputs_in_fp32(item) for key, item in value.items()})
    if isinstance(value, (tuple, list)):
        return type(value)(outputs_in_fp32(item) for item in value)
    return value


class TrainerForward:
    """Calls `model` as the Trainer's prepared model runs under `bf16: true`: inside `torch.autocast` (on the
    device type of the model's weights) and with fp32 outputs. In fp32 it calls the model as it is."""

    def __init__(self, model: torch.nn.Module, dtype: str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        self.model = model
        self.autocast = dtype == "bfloat16"

    def __call__(self, *args, **kwargs):
        if not self.autocast:
            return self.model(*args, **kwargs)
        device_type = next(self.model.parameters()).device.type
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16):
            outputs = self.model(*args, **kwargs)
        return outputs_in_fp32(outputs)
