"""The one place that silences the third-party warnings every run without CUDA, Transformer Engine or apex prints.

megatron-core warns once per module that TE and apex are absent (six lines on import), and torch logs that it found
no CUDA runtime. On CPU these say nothing a user can act on, so the tools, the recipe launcher and the demo call
`install()` first; when the absence does matter (a GPU without TE/apex), `kernels_note()` gives one line instead.
Only these known messages are filtered: any other warning still shows. Importing this module does not import torch.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import warnings

# Prefixes of the messages (they also serve PYTHONWARNINGS, which matches a literal prefix).
KNOWN_WARNINGS = (
    "Transformer Engine and Apex are not installed",
    "Apex is not installed",
)
# torch's logger and the message it logs on import when CUDA_HOME exists but CUDA does not.
_TORCH_LOGGER, _TORCH_MESSAGE = "torch.utils.cpp_extension", "No CUDA runtime is found"


class _DropNoCuda(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_TORCH_MESSAGE)


def install(children: bool = True) -> None:
    """Filter the known warnings in this process; with `children`, also in processes it starts (torchrun workers
    inherit PYTHONWARNINGS and TORCH_LOGS). Idempotent."""
    for message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    logger = logging.getLogger(_TORCH_LOGGER)
    if not any(isinstance(f, _DropNoCuda) for f in logger.filters):
        logger.addFilter(_DropNoCuda())
    if children:
        _append_env("PYTHONWARNINGS", [f"ignore:{m}" for m in KNOWN_WARNINGS])
        _append_env("TORCH_LOGS", [f"-{_TORCH_LOGGER}"])


def _append_env(name: str, items: list[str]) -> None:
    current = [i for i in os.environ.get(name, "").split(",") if i]
    os.environ[name] = ",".join(current + [i for i in items if i not in current])


def kernels_note() -> str | None:
    """One line when CUDA is there but TE or apex is not (slower layers, no FP8); None when it does not matter."""
    from mlmclm.parallel.runtime import on_gpu  # the one module that asks torch.cuda

    if not on_gpu():
        return None
    missing = [name for name, module in (("Transformer Engine", "transformer_engine"), ("apex", "apex"))
               if importlib.util.find_spec(module) is None]
    if not missing:
        return None
    return (f"note: {' and '.join(missing)} not installed: megatron's local layers and torch's fused optimizers are "
            f"used instead{' (no FP8)' if 'Transformer Engine' in missing else ''}")
