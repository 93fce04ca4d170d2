"""Bit-reproducible training on GPUs: the switches Megatron-LM's `--deterministic-mode` documents, in one place.

On CPU our runs are already reproducible (fixed seeds, one thread order per op). On a GPU several kernels are not
run to run: atomics in the embedding backward, cuBLAS workspace splits, TE's fused attention backward, NCCL's
algorithm choice. An H200 run of ours differed from its twin from step 5 (±1e-4 in the loss), so a stopped and
resumed run there is not bit-identical to an uninterrupted one without these switches:
- megatron `TransformerConfig.deterministic_mode` (deterministic embedding backward; refuses TE attention unless
  NVTE_ALLOW_NONDETERMINISTIC_ALGO=0),
- `NVTE_ALLOW_NONDETERMINISTIC_ALGO=0` (TE picks deterministic attention kernels),
- `CUBLAS_WORKSPACE_CONFIG=:4096:8` and `torch.use_deterministic_algorithms(True)`,
- `NCCL_ALGO=Ring` (one reduction order), unless the environment already chose one,
- Inductor's deterministic mode (`TORCHINDUCTOR_DETERMINISTIC=1` and `torch._inductor.config.deterministic`):
  megatron compiles its bias/activation, bias/dropout and cross-entropy fusions with `torch.compile`, and Inductor
  otherwise picks among kernel variants by timing them on the device, in each process anew — a run and its resume
  could run differently rounded kernels. The deterministic mode skips every such timing that affects numerics.
Costs speed (how much: unmeasured). Unverified on a GPU: no GPU run has compared two deterministic runs yet
(`benchmarks/gpu_check.py` does, step by step).
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

ENVIRONMENT = {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_ALGO": "Ring",
               "TORCHINDUCTOR_DETERMINISTIC": "1"}
REQUIRED = ("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "TORCHINDUCTOR_DETERMINISTIC")  # a launcher may not override these


def enable_determinism() -> dict[str, str]:
    """Set the switches for this process (before NCCL and the model are created); returns the environment used."""
    import torch

    applied = {}
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)  # an explicit choice of the launcher wins
        applied[name] = os.environ[name]
    for name in REQUIRED:
        if applied[name] != ENVIRONMENT[name]:
            raise ValueError(f"deterministic: true needs {name}={ENVIRONMENT[name]}, but the environment sets "
                             f"{applied[name]!r}")
    torch.use_deterministic_algorithms(True)
    import torch._inductor.config as inductor_config

    # Inductor read its environment variable when first imported, possibly before this call.
    inductor_config.deterministic = True
    log.info("deterministic mode: %s, torch.use_deterministic_algorithms(True)",
             ", ".join(f"{k}={v}" for k, v in applied.items()))
    return applied
