"""Build EuroBERT as megatron-core `GPTModel` chunks; switch its attention between causal and bidirectional."""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from mlmclm.model.config import ModelConfig
from mlmclm.model.fusions import fusion_flags
from mlmclm.model.precision import PrecisionConfig, fp8_attention_here, transformer_engine_available
from mlmclm.model.spec import block_spec
from mlmclm.parallel import runtime
from mlmclm.parallel.runtime import ParallelConfig, current_device

log = logging.getLogger(__name__)


def transformer_config(model: ModelConfig, parallel: ParallelConfig, precision: PrecisionConfig | None = None,
                       use_te: bool = False, fused_kernels: bool = True,
                       deterministic: bool = False) -> TransformerConfig:
    precision = precision or PrecisionConfig()
    on_gpu = runtime.on_gpu()
    dtype = precision.resolved_dtype(on_gpu)
    if precision.fp8 and not use_te:
        raise ValueError("precision.fp8 needs Transformer Engine layers (TE importable and a CUDA device)")
    fp8_attention = False
    if precision.fp8 and precision.fp8_attention != "off":
        fp8_attention, reason = fp8_attention_here(model.head_dim, precision.fp8_recipe, training=True)
        if precision.fp8_attention == "on" and not fp8_attention:
            raise ValueError(reason)
        log.info(reason)
    params_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    return TransformerConfig(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_kv_heads,
        ffn_hidden_size=model.ffn_hidden_size,
        kv_channels=model.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=model.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=model.init_std,
        tensor_model_parallel_size=parallel.tensor_parallel,
        pipeline_model_parallel_size=parallel.pipeline_parallel,
        virtual_pipeline_model_parallel_size=parallel.virtual_pipeline_parallel,
        context_parallel_size=parallel.context_parallel,
        sequence_parallel=parallel.sequence_parallel,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        bf16=dtype == "bf16",
        fp8=precision.fp8,
        fp8_recipe=precision.fp8_recipe,
        **precision.fp8_scaling_kwargs(),
        fp8_dot_product_attention=fp8_attention,
        # Each fused kernel only where it can be imported for this spec (mlmclm/model/fusions.py); logged.
        **fusion_flags(use_te, enabled=fused_kernels).config_kwargs(),
        attention_softmax_in_fp32=True,
        # Losses are token sums; megatron divides gradients by the global batch's token count (DP- and
        # micro-batch-invariant). DDP reads this when it is built, so it belongs here.
        calculate_per_token_loss=True,
        deterministic_mode=deterministic,  # see mlmclm.train.determinism
    )


def resolve_use_te(requested: bool | None) -> bool:
    """TE layers when asked for (an error if impossible); by default when available, with the fallback logged."""
    available, why = transformer_engine_available()
    if requested and not available:
        raise ValueError(f"Transformer Engine layers requested but unavailable: {why}")
    if requested is None and not available:
        # On a GPU the fallback is a real loss (no FP8, slower attention), so say it loudly there.
        level = logging.WARNING if runtime.on_gpu() else logging.INFO
        log.log(level, "layer spec: megatron local layers, not Transformer Engine (%s)", why)
    return available if requested is None else requested


def build_model(model: ModelConfig, parallel: ParallelConfig, precision: PrecisionConfig | None = None,
                causal: bool = False, use_te: bool | None = None, fused_kernels: bool = True,
                deterministic: bool = False) -> list[GPTModel]:
    """This rank's model chunks (one per virtual pipeline stage), on the current device.

    `causal` picks the initial attention; `set_causal` switches it later without rebuilding anything.
    `fused_kernels=False` switches every megatron fused kernel off (else each is on where it can run).
    """
    model.validate_layout(parallel)
    use_te = resolve_use_te(use_te)
    config = transformer_config(model, parallel, precision, use_te, fused_kernels, deterministic)
    vpp = parallel.virtual_pipeline_parallel
    stages = range(vpp) if vpp else [None]
    chunks = []
    for vp_stage in stages:
        gpt = GPTModel(
            config=config,
            transformer_layer_spec=block_spec(config, use_te, vp_stage),
            vocab_size=model.padded_vocab_size(parallel.tensor_parallel),
            max_sequence_length=model.max_position_embeddings,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            share_embeddings_and_output_weights=False,
            position_embedding_type="rope",
            rotary_base=model.rope_theta,
            rope_scaling=bool(model.rope_scaling),
            rope_scaling_factor=float((model.rope_scaling or {}).get("factor", 8.0)),
            vp_stage=vp_stage,
        )
        gpt.uses_transformer_engine = use_te  # per-document attention: THD with TE, a mask with local layers
        gpt.to(current_device())
        chunks.append(gpt)
    set_causal(chunks, causal)
    return chunks


def set_causal(chunks, causal: bool) -> None:
    """Switch every attention layer between causal (CLM) and bidirectional (MLM); the weights are untouched."""
    mask_type = AttnMaskType.causal if causal else AttnMaskType.no_mask
    for chunk in chunks:
        for module in chunk.modules():
            if hasattr(module, "attn_mask_type") and isinstance(module.attn_mask_type, AttnMaskType):
                module.attn_mask_type = mask_type
            # The local softmax keeps its own copy and builds the causal mask from it.
            softmax = getattr(module, "scale_mask_softmax", None)
            if softmax is not None:
                softmax.attn_mask_type = mask_type


def is_causal(chunks) -> bool:
    for chunk in chunks:
        for module in chunk.modules():
            if isinstance(getattr(module, "attn_mask_type", None), AttnMaskType):
                return module.attn_mask_type == AttnMaskType.causal
    raise ValueError("no attention layer found in the model chunks")
