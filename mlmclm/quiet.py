"""The one place that silences the third-party warnings every run without CUDA, Transformer Engine or apex prints
(and NeMo-Run's timing-dependent wait for its log tail).

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

# Prefixes of the messages (they also serve PYTHONWARNINGS, which matches a literal prefix: no ',' or ':' here).
KNOWN_WARNINGS = (
    "Transformer Engine and Apex are not installed",
    "Apex is not installed",
    # megatron-core 0.19's TransformerConfig default (cuda_graph_scope) warns on every model build
    "full scope is deprecated",
    # torch DCP, when our single-process readers (conversion, verification) load without a process group
    "torch.distributed is disabled",
    "The argument order of load has been changed",
    # the CPU emulation's ShardedTensor shim (megatron's dist checkpoints still use ShardedTensor on CPU)
    "Please use DTensor instead and we are deprecating ShardedTensor",
    # megatron's DDP reads `.grad` of its main-grad views while finalising gradients
    "The .grad attribute of a Tensor that is not a leaf Tensor is being accessed",
)
# Known log messages, by logger: torch's on import when CUDA_HOME exists but CUDA does not; megatron's on every
# model build (we keep GPTModel behind mlmclm/model/ on purpose, see the README) and on every save.
KNOWN_LOG_MESSAGES = {
    "torch.utils.cpp_extension": "No CUDA runtime is found",
    "megatron.core.models.gpt.gpt_model": "GPTModel IS DEPRECATED",
    "megatron.core.dist_checkpointing.strategies.torch": "MCore's async save is deprecated",
    # NeMo-Run, when a local task ends while the thread tailing its log is still reading: "Waiting for <task>'s log
    # thread to complete for 10 seconds..." on stderr, or not, by timing; it came before a refusal's one line
    "nemo_run.run.torchx_backend.launcher": "Waiting for ",
}
_TORCH_LOGGER = "torch.utils.cpp_extension"


class _DropKnown(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def install(children: bool = True) -> None:
    """Filter the known warnings in this process; with `children`, also in processes it starts (torchrun workers
    inherit PYTHONWARNINGS and TORCH_LOGS). Idempotent."""
    for message in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    for name, prefix in KNOWN_LOG_MESSAGES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnown) for f in logger.filters):
            logger.addFilter(_DropKnown(prefix))
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
