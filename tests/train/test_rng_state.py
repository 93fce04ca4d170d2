"""The generator states a checkpoint holds (mlmclm.train.rng_state) survive torch.save and the weights-only loader,
and restore every stream: torch's, Python's `random`, numpy's global one (CUDA's where present). The resume of a
real run is tested in test_fused_adam_resume.py (draws from `random` and numpy continue across it)."""
import random

import numpy as np
import torch

from mlmclm.train import rng_state


def draws() -> list:
    return [torch.rand(2).tolist(), random.random(), random.gauss(0, 1), float(np.random.rand()),
            float(np.random.standard_normal())]


def test_states_round_trip_through_the_weights_only_loader(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    draws()  # leave the generators mid-stream, Gaussian caches filled
    state = rng_state.capture()
    assert set(state) >= {"torch", "tracker", "python", "numpy"}
    assert ("cuda" in state) == torch.cuda.is_available()
    torch.save(state, tmp_path / "rng.pt")
    expected = draws()
    rng_state.restore(torch.load(tmp_path / "rng.pt", weights_only=True))  # nothing but tensors and plain values
    assert draws() == expected


def test_checkpoints_from_before_python_and_numpy_states_still_restore():
    state = rng_state.capture()
    old = {"torch": state["torch"], "tracker": state["tracker"]}
    rng_state.restore(old)
