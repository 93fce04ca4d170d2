"""The chunked head's weight gradient under megatron's gradient-accumulation fusion.

With `gradient_accumulation_fusion` (on wherever apex's `fused_weight_gradient_mlp_cuda` imports: the NGC images),
megatron's linear layers never hand autograd a weight gradient: their backward accumulates it in fp32 straight into
the parameter's `main_grad` (DDP's fp32 buffer) with apex's accumulating GEMM, marks the parameter
`grad_added_to_main_grad` and returns a dummy that DDP's hook then ignores
(`LinearWithGradAccumulationAndAsyncCommunication.backward` and `DistributedDataParallel._make_backward_post_hook`,
megatron-core 0.19). The chunked head (mlmclm.model.chunked_head) follows the same contract for the output layer:
each chunk's gradient goes into its fp32 sum through the same kernel (mlmclm.model.wgrad_gemm), and the backward
adds that sum, scaled by the incoming gradient, into `main_grad` — no rounding of the
micro-batch's weight gradient to bf16, as megatron's own fused head.
"""
from __future__ import annotations

import torch


def fuses_wgrad(output_layer, weight: torch.Tensor) -> bool:
    """Whether megatron would accumulate this layer's weight gradient into `main_grad` itself (its own condition:
    the layer's `gradient_accumulation_fusion` and a weight that has a `main_grad`)."""
    return bool(getattr(output_layer, "gradient_accumulation_fusion", False)) and hasattr(weight, "main_grad")


def add_to_main_grad(weight: torch.Tensor, grad_weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor | None:
    """`weight.main_grad += grad_weight × scale` (fp32, no rounding to the weight's dtype); returns what the
    backward hands autograd for the weight, as megatron's fused linear does: a dummy when DDP tracks
    `grad_added_to_main_grad` (zeros if the weight is shared with the embedding, `zero_out_wgrad`, whose own
    gradient DDP still adds), else None."""
    weight.main_grad.addcmul_(grad_weight, scale.to(grad_weight.dtype))
    if not hasattr(weight, "grad_added_to_main_grad"):
        return None
    from megatron.core.tensor_parallel import layers

    zero = bool(getattr(weight, "zero_out_wgrad", False))
    if layers.HAVE_TE:  # TE's one reusable dummy, as megatron takes it
        dummy = layers.get_dummy_wgrad(list(weight.main_grad.shape), weight.dtype, zero=zero)
    else:
        make = torch.zeros if zero else torch.empty
        dummy = make(weight.main_grad.shape, dtype=weight.dtype, device=weight.device)
    weight.grad_added_to_main_grad = True
    return dummy
