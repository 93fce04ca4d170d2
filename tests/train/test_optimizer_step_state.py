"""Resume adds a per-parameter Adam `step` only for torch's optimizers (the CPU path).

On an H200 with Transformer Engine, megatron builds TE's FusedAdam, which keeps the step in its parameter groups;
the per-parameter `step` that load_full_state used to add for torch's Adam made TE's `state_dict` raise
KeyError 'step' on every resume. TE cannot run here, so this checks the decision on the optimizer types."""
import types

import torch

from mlmclm.train.checkpoint import keeps_step_per_parameter


def test_torch_adam_keeps_its_step_per_parameter():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert keeps_step_per_parameter(torch.optim.Adam(params))
    assert keeps_step_per_parameter(torch.optim.AdamW(params))


def test_fused_adams_of_te_and_apex_do_not():
    params = [torch.nn.Parameter(torch.zeros(2))]
    for module in ("transformer_engine.pytorch.optimizers.fused_adam", "apex.optimizers.fused_adam"):
        # A class living where TE's / apex's FusedAdam lives (neither is importable without CUDA).
        fused = types.new_class("FusedAdam", (torch.optim.Optimizer,))
        fused.__module__ = module
        assert not keeps_step_per_parameter(fused(params, {"lr": 1e-3}))
