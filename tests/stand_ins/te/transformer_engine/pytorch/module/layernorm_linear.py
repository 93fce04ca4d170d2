"""TE's `LayerNormLinear` (`transformer_engine/pytorch/module/layernorm_linear.py`, TE 2.20): the norm fused in
front of a linear, computed with torch. megatron's `TELayerNormColumnParallelLinear` subclasses it (the TE layer
spec's `linear_qkv` and `linear_fc1`).

Modelled, as read from TE's constructor, `reset_parameters` and `_LayerNormLinear.forward`:
- everything `Linear` models for its GEMM (sharding, `weight`/`bias`, parallel attributes, comms, return_bias);
- `normalization` "LayerNorm" or "RMSNorm" (else TE's assertion); `layer_norm_weight` [in_features] (and
  `layer_norm_bias` for LayerNorm; RMSNorm leaves `layer_norm_bias = None`), initialised to 1, or 0 with
  `zero_centered_gamma` (then applied as 1 + gamma), registered before `weight`;
- the norm's parameters marked `sequence_parallel` (= TP > 1 and sequence_parallel): with SP each TP rank
  normalises only its slice of the sequence, so megatron must all-reduce their gradients over the TP group;
- the order TE runs: normalise the local (sequence-parallel) input, then all-gather the *normalised* output along
  the sequence for a column layer, then the GEMM;
- `fuse_wgrad_accumulation`: the weight gradient into `weight.main_grad`, as `Linear` models it (TE's
  `_LayerNormLinear.backward` runs the same wgrad GEMM and dummy); the norm's own gradients go to autograd;
- `return_layernorm_output(_gathered)`, userbuffers: refused.
Not modelled: TE's fused norm + cast kernels, FP8, and TE's refusal of CPU tensors.
"""
from __future__ import annotations

import torch

from transformer_engine.pytorch.module._norm import normalize
from transformer_engine.pytorch.module.linear import _TensorParallelGemm, refuse_unmodelled


def constant(value: float):
    return lambda tensor: torch.nn.init.constant_(tensor, value)


class LayerNormLinear(_TensorParallelGemm):
    def __init__(self, in_features: int, out_features: int, eps: float = 1e-5, sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False, tp_group=None, tp_size: int = 1, get_rng_state_tracker=None,
                 init_method=None, bias: bool = True, normalization: str = "LayerNorm", return_bias: bool = False,
                 params_dtype=None, parallel_mode=None, return_layernorm_output: bool = False,
                 return_layernorm_output_gathered: bool = False, parameters_split=None,
                 zero_centered_gamma: bool = False, device="cuda", name=None, **options) -> None:
        super().__init__(name)
        refuse_unmodelled("LayerNormLinear", {
            "parameters_split": parameters_split,
            "return_layernorm_output": return_layernorm_output,
            "return_layernorm_output_gathered": return_layernorm_output_gathered, **options})
        assert normalization in ("LayerNorm", "RMSNorm"), "Unsupported normalization type!"
        self.normalization, self.eps, self.zero_centered_gamma = normalization, eps, zero_centered_gamma
        dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
        gamma = constant(float(not zero_centered_gamma))
        self.register_parameter("layer_norm_weight", torch.nn.Parameter(torch.empty(in_features, device=device,
                                                                                    dtype=dtype)),
                                init_fn=gamma, get_rng_state_tracker=get_rng_state_tracker)
        if normalization != "RMSNorm":
            self.register_parameter("layer_norm_bias", torch.nn.Parameter(torch.empty(in_features, device=device,
                                                                                      dtype=dtype)),
                                    init_fn=constant(0.0), get_rng_state_tracker=get_rng_state_tracker)
        else:
            self.layer_norm_bias = None
        self._init_gemm(in_features, out_features, sequence_parallel, tp_group, tp_size, get_rng_state_tracker,
                        None, init_method, bias, return_bias, params_dtype, parallel_mode, device,
                        fuse_wgrad_accumulation)
        self.reset_parameters(defer_init=device == "meta")

    def reset_parameters(self, defer_init: bool = False) -> None:
        super().reset_parameters(defer_init=defer_init)
        if not defer_init:
            self.layer_norm_weight.sequence_parallel = self.sequence_parallel
            if self.normalization != "RMSNorm":
                self.layer_norm_bias.sequence_parallel = self.sequence_parallel
            self._set_gemm_attributes()

    def forward(self, inp: torch.Tensor, is_first_microbatch=None, fp8_output: bool = False,
                fp8_grad: bool = False):
        if fp8_output or fp8_grad:
            raise NotImplementedError("the TE LayerNormLinear stand-in models no FP8 outputs or gradients")
        inp = self.prepare_forward(inp)
        self.is_first_microbatch = is_first_microbatch
        normalized = normalize(inp, self.layer_norm_weight, self.layer_norm_bias, self.eps, self.normalization,
                               self.zero_centered_gamma)
        return self._gemm(normalized, inp.shape[1:-1])
