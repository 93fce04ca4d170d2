"""TE's `Linear` (`transformer_engine/pytorch/module/linear.py`, TE 2.20), computed with torch.

Modelled, as read from TE's constructor, `reset_parameters` and `forward`:
- `parallel_mode` None/"column"/"row" (anything else refused, TE's assertion); column divides `out_features` by
  the TP size, row divides `in_features`; `sequence_parallel` only when TP > 1;
- parameters `weight` [out, in] (and `bias` [out] when `bias=True`, else an empty tensor attribute), created with
  `params_dtype` on `device`, initialised by `init_method` (bias: zeros) under the RNG tracker's fork; then the
  attributes megatron reads: weight `tensor_model_parallel`/`partition_dim` (1 for row, else 0)/`partition_stride`;
  a column bias partitioned along 0; a row bias marked `sequence_parallel`;
- the communication around the GEMM (see `_parallel.py`): column + SP all-gathers the input along the sequence
  (dgrad reduce-scattered), row + SP reduce-scatters the output, row without SP all-reduces it;
- a row layer adds its bias after the reduction; `return_bias=True` returns `(out, bias)` with the bias not added;
- the output keeps the input's leading dimensions: `[-1, *inp.shape[1:-1], out_features]`;
- `fuse_wgrad_accumulation=True` (what megatron passes when its `gradient_accumulation_fusion` is on), as TE's
  backward runs it (`_Linear.backward`, read at 2.2 and 2.20): the weight gradient GEMM writes into
  `weight.main_grad` in main_grad's dtype — accumulating, except on a micro-batch marked `is_first_microbatch=True`,
  which overwrites it — and autograd gets `get_dummy_wgrad(weight shape, weight dtype)` (zero-filled when the
  weight has `zero_out_wgrad`) with `grad_added_to_main_grad` set, when megatron's DDP tracks that attribute,
  else None; a weight without `main_grad` fails (AttributeError), read at the backward as TE >= 2.x's
  `main_grad_func` reads it;
- userbuffers, `parameters_split`, `delay_wgrad_compute`, symmetric all-reduce: refused.
Not modelled: the GEMM kernels (cuBLAS, FP8; the wgrad GEMM accumulates in fp32 here), FP8 weight caching
(`is_first_microbatch` only decides the main_grad overwrite), and TE's refusal of CPU tensors.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from transformer_engine.pytorch.distributed import set_tensor_model_parallel_attributes
from transformer_engine.pytorch.module._parallel import column_input, row_output
from transformer_engine.pytorch.module.base import TransformerEngineBaseModule, get_dummy_wgrad

GEMM_PARALLEL_MODES = (None, "column", "row")
_REFUSED = ("ub_overlap_ag", "ub_overlap_rs", "ub_overlap_rs_dgrad", "ub_bulk_dgrad", "ub_bulk_wgrad",
            "delay_wgrad_compute", "parameters_split", "symmetric_ar_type",
            "return_layernorm_output", "return_layernorm_output_gathered")


def refuse_unmodelled(module: str, options: dict) -> None:
    for name, value in options.items():
        if name in _REFUSED and value not in (None, False):
            raise NotImplementedError(f"the TE {module} stand-in does not model {name}={value!r}")


def divide(numerator: int, denominator: int) -> int:
    if numerator % denominator:
        raise AssertionError(f"{numerator} is not divisible by {denominator}")
    return numerator // denominator


class _TensorParallelGemm(TransformerEngineBaseModule):
    """What Linear and LayerNormLinear share: the sharded weight, its attributes and the GEMM with its comms."""

    def _init_gemm(self, in_features, out_features, sequence_parallel, tp_group, tp_size, get_rng_state_tracker,
                   rng_tracker_name, init_method, bias, return_bias, params_dtype, parallel_mode, device,
                   fuse_wgrad_accumulation=False):
        params_dtype = torch.get_default_dtype() if params_dtype is None else params_dtype
        self.fuse_wgrad_accumulation = fuse_wgrad_accumulation
        self.is_first_microbatch = None
        self.in_features, self.out_features = in_features, out_features
        self.use_bias, self.return_bias = bias, return_bias
        self.apply_bias = bias and not return_bias
        self.rng_tracker_name = rng_tracker_name
        self._set_tp(tp_group, tp_size)
        assert parallel_mode in GEMM_PARALLEL_MODES, f"parallel_mode {parallel_mode} not supported"
        self.parallel_mode = parallel_mode
        if parallel_mode == "column":
            self.out_features = divide(self.out_features, self.tp_size)
        elif parallel_mode == "row":
            self.in_features = divide(self.in_features, self.tp_size)
        self.sequence_parallel = self.tp_size > 1 and sequence_parallel
        weight = torch.empty(self.out_features, self.in_features, device=device, dtype=params_dtype)
        self.register_parameter("weight", torch.nn.Parameter(weight), init_fn=init_method,
                                get_rng_state_tracker=get_rng_state_tracker)
        if bias:
            self.register_parameter("bias", torch.nn.Parameter(torch.empty(self.out_features, device=device,
                                                                           dtype=params_dtype)),
                                    init_fn=torch.nn.init.zeros_, get_rng_state_tracker=get_rng_state_tracker)
        else:
            self.bias = torch.Tensor().to(dtype=params_dtype, device=device)

    def _set_gemm_attributes(self) -> None:
        set_tensor_model_parallel_attributes(self.weight, True, 1 if self.parallel_mode == "row" else 0, 1)
        if self.use_bias:
            if self.parallel_mode == "row":
                self.bias.sequence_parallel = self.sequence_parallel
            elif self.parallel_mode == "column":
                set_tensor_model_parallel_attributes(self.bias, True, 0, 1)

    def _gemm(self, inp: torch.Tensor, leading_shape) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        total = column_input(inp, self.parallel_mode, self.sequence_parallel, self.tp_size, self.tp_group)
        row = self.parallel_mode == "row"
        bias = self.bias if self.apply_bias and not row else None
        if self.fuse_wgrad_accumulation and self.weight.requires_grad and torch.is_grad_enabled():
            out = _LinearIntoMainGrad.apply(total, self.weight, bias, self.is_first_microbatch)
        else:
            out = F.linear(total, self.weight, bias)
        out = row_output(out, self.parallel_mode, self.sequence_parallel, self.tp_size, self.tp_group)
        if self.apply_bias and row:
            out = out + self.bias
        out = out.view(-1, *leading_shape, self.out_features)
        return (out, self.bias) if self.return_bias else out


class Linear(_TensorParallelGemm):
    def __init__(self, in_features: int, out_features: int, sequence_parallel: bool = False,
                 fuse_wgrad_accumulation: bool = False, tp_group=None, tp_size: int = 1, get_rng_state_tracker=None,
                 rng_tracker_name=None, init_method=None, bias: bool = True, return_bias: bool = False,
                 params_dtype=None, parallel_mode=None, parameters_split=None, device="cuda", name=None,
                 **options) -> None:
        super().__init__(name)
        refuse_unmodelled("Linear", {"parameters_split": parameters_split, **options})
        self._init_gemm(in_features, out_features, sequence_parallel, tp_group, tp_size, get_rng_state_tracker,
                        rng_tracker_name, init_method, bias, return_bias, params_dtype, parallel_mode, device,
                        fuse_wgrad_accumulation)
        self.reset_parameters(defer_init=device == "meta")

    def reset_parameters(self, defer_init: bool = False) -> None:
        super().reset_parameters(defer_init=defer_init)
        if not defer_init:
            self._set_gemm_attributes()

    def forward(self, inp: torch.Tensor, is_first_microbatch=None, fp8_output: bool = False,
                fp8_grad: bool = False):
        if fp8_output or fp8_grad:
            raise NotImplementedError("the TE Linear stand-in models no FP8 outputs or gradients")
        inp = self.prepare_forward(inp)
        self.is_first_microbatch = is_first_microbatch
        return self._gemm(inp, inp.shape[1:-1])


class _LinearIntoMainGrad(torch.autograd.Function):
    """The GEMM with `fuse_wgrad_accumulation`: its weight gradient goes into `weight.main_grad` (see the module)."""

    @staticmethod
    def forward(ctx, inp, weight, bias, is_first_microbatch):
        ctx.save_for_backward(inp, weight)
        ctx.weight, ctx.has_bias = weight, bias is not None
        ctx.accumulate = True if is_first_microbatch is None else not is_first_microbatch
        return F.linear(inp, weight, bias)

    @staticmethod
    def backward(ctx, grad):
        inp, weight = ctx.saved_tensors
        main_grad = ctx.weight.main_grad  # AttributeError without one, as in TE
        flat_grad, flat_inp = grad.reshape(-1, grad.shape[-1]), inp.reshape(-1, inp.shape[-1])
        wgrad = (flat_grad.float().t() @ flat_inp.float()).to(main_grad.dtype)
        if ctx.accumulate:
            main_grad.add_(wgrad)
        else:
            main_grad.copy_(wgrad)
        dummy = None
        if hasattr(ctx.weight, "grad_added_to_main_grad"):
            ctx.weight.grad_added_to_main_grad = True
            dummy = get_dummy_wgrad(list(weight.shape), weight.dtype, zero=getattr(ctx.weight, "zero_out_wgrad", False))
        grad_bias = flat_grad.sum(0) if ctx.has_bias else None
        return grad @ weight, dummy, grad_bias, None
