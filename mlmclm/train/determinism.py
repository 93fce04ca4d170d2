"""Bit-reproducible training on GPUs: the switches Megatron-LM's `--deterministic-mode` documents, in one place.

On CPU our runs are already reproducible (fixed seeds, one thread order per op). On a GPU several kernels are not
run to run: atomics in the embedding backward, cuBLAS workspace splits, TE's fused attention backward, NCCL's
algorithm choice. An H200 run of ours differed from its twin from step 5 (±1e-4 in the loss), so a stopped and
resumed run there is not bit-identical to an uninterrupted one without these switches:
- megatron `TransformerConfig.deterministic_mode` (deterministic embedding backward; refuses TE attention unless
  NVTE_ALLOW_NONDETERMINISTIC_ALGO=0),
- `NVTE_ALLOW_NONDETERMINISTIC_ALGO=0` (TE picks deterministic attention kernels),
- `CUBLAS_WORKSPACE_CONFIG=:4096:8` and `torch.use_deterministic_algorithms(True)`,
- `NCCL_ALGO=Ring` (one reduction order), unless the environment already chose one.
Costs speed (how much: unmeasured). Unverified on a GPU: no GPU run has compared two deterministic runs yet.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

ENVIRONMENT = {"NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "NCCL_ALGO": "Ring"}


def enable_determinism() -> dict[str, str]:
    """Set the switches for this process (before NCCL and the model are created); returns the environment used."""
    import torch

    applied = {}
    for name, value in ENVIRONMENT.items():
        os.environ.setdefault(name, value)  # an explicit choice of the launcher wins
        applied[name] = os.environ[name]
    if applied["NVTE_ALLOW_NONDETERMINISTIC_ALGO"] != "0":
        raise ValueError("deterministic: true needs NVTE_ALLOW_NONDETERMINISTIC_ALGO=0, but the environment sets "
                         f"{applied['NVTE_ALLOW_NONDETERMINISTIC_ALGO']!r}")
    torch.use_deterministic_algorithms(True)
    log.info("deterministic mode: %s, torch.use_deterministic_algorithms(True)",
             ", ".join(f"{k}={v}" for k, v in applied.items()))
    return applied
