"""Every random generator a training process draws from, as one checkpointable dict, and back.

Megatron-LM restores the same set on resume: torch's CPU generator, CUDA's default one, megatron's model-parallel
tracker states (dropout streams), Python's `random` and numpy's global generator. Nothing in training draws from the
last three today (no dropout, counter-based masks), so a missing one would only show when a feature starts drawing.
The dict holds tensors, ints, floats, strings and None only: it is written with `torch.save` and read with
`torch.load(..., weights_only=True)` — nothing from a checkpoint is unpickled as an arbitrary object.
"""
from __future__ import annotations

import random

import numpy as np
import torch

from mlmclm.parallel.runtime import cuda_rng_state, set_cuda_rng_state


def capture() -> dict:
    from megatron.core import tensor_parallel

    version, mt_state, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state = {
        "torch": torch.get_rng_state(),
        "tracker": dict(tensor_parallel.get_cuda_rng_tracker().get_states()),
        "python": {"version": version, "state": torch.tensor(mt_state, dtype=torch.int64), "gauss_next": gauss_next},
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
    }
    cuda = cuda_rng_state()
    if cuda is not None:
        state["cuda"] = cuda
    return state


def restore(state: dict) -> None:
    """Set every generator `state` holds (checkpoints written before a generator was added lack its entry)."""
    from megatron.core import tensor_parallel

    torch.set_rng_state(state["torch"])
    tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])
    if "cuda" in state:
        set_cuda_rng_state(state["cuda"])
    if "python" in state:
        py = state["python"]
        random.setstate((py["version"], tuple(py["state"].tolist()), py["gauss_next"]))
    if "numpy" in state:
        npy = state["numpy"]
        np.random.set_state((npy["name"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                             npy["cached_gaussian"]))
