"""TE's fused MoE router kernels (`transformer_engine/pytorch/router.py`, TE >= 2.7), which megatron imports
unconditionally at load when TE reports such a version. Not modelled (no mixture of experts here): each refuses."""


def _not_modelled(*args, **kwargs):
    raise NotImplementedError("the TE stand-in models no MoE router kernels")


fused_topk_with_score_function = _not_modelled
fused_compute_score_for_moe_aux_loss = _not_modelled
fused_moe_aux_loss = _not_modelled
