"""Build the model (EuroBERT or ModernBERT) as megatron-core `GPTModel` chunks; switch its attention between causal
and bidirectional. What differs between the architectures comes from `mlmclm.model.architectures`."""
from __future__ import annotations

import logging

import torch
from megatron.core import parallel_state
from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from mlmclm.model.architectures import architecture
from mlmclm.model.config import ModelConfig
from mlmclm.model.document_attention import check_local_packed_attention
from mlmclm.model.fusions import fusion_flags
from mlmclm.model.precision import (PrecisionConfig, attention_layout_name, fp8_attention_here, fp8_recipe_error,
                                    installed_te_version, transformer_engine_available)
from mlmclm.parallel import runtime
from mlmclm.parallel.runtime import ParallelConfig, current_device

log = logging.getLogger(__name__)


def transformer_config(model: ModelConfig, parallel: ParallelConfig, precision: PrecisionConfig | None = None,
                       use_te: bool = False, fused_kernels: bool = True,
                       deterministic: bool = False, packed_segments: bool = False) -> TransformerConfig:
    """`packed_segments`: the batches are cut into segments (random-length samples, per-document attention), which
    TE layers attend to as packed THD — a layout TE's FP8 attention cannot take."""
    precision = precision or PrecisionConfig()
    on_gpu = runtime.on_gpu()
    dtype = precision.resolved_dtype(on_gpu)
    if precision.fp8 and not use_te:
        raise ValueError("precision.fp8 needs Transformer Engine layers (TE importable and a CUDA device)")
    if precision.fp8:
        unsupported = fp8_recipe_error(runtime.gpu_capability(), precision.fp8_recipe, installed_te_version(),
                                       torch.version.cuda)
        if unsupported:
            raise ValueError(unsupported)
    fp8_attention = False
    if precision.fp8 and precision.fp8_attention != "off":
        fp8_attention, reason = fp8_attention_here(model.head_dim, precision.fp8_recipe,
                                                   attention_layout_name(packed_segments, use_te), training=True,
                                                   deterministic=deterministic)
        if precision.fp8_attention == "on" and not fp8_attention:
            raise ValueError(reason)
        log.info(reason)
    params_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    # Each fused kernel only where it can be imported for this spec (mlmclm/model/fusions.py); logged.
    fusions = fusion_flags(use_te, enabled=fused_kernels)
    if use_te and packed_segments and not fusions.apply_rope_fusion.on:
        # megatron's unfused THD RoPE (`rope_utils._apply_rotary_pos_emb_thd`) reads cu_seqlens from the device with
        # .tolist()/.item() in every layer: ~4 host synchronisations per layer and micro-batch, where a step has one.
        raise ValueError("packed segments on Transformer Engine layers need TE's fused THD RoPE (apply_rope_fusion), "
                         f"which is off here ({fusions.apply_rope_fusion.reason}): megatron's unfused THD RoPE "
                         "synchronises with the host in every layer. Keep fused_kernels on with a TE that has "
                         "fused_apply_rotary_pos_emb_thd")
    # The architecture's own settings (norm, activation, windows) win over the fusions' defaults.
    kernels = {**fusions.config_kwargs(), **architecture(model).config_kwargs(model)}
    return TransformerConfig(
        num_layers=model.num_layers,
        hidden_size=model.hidden_size,
        num_attention_heads=model.num_attention_heads,
        num_query_groups=model.num_kv_heads,
        ffn_hidden_size=model.ffn_hidden_size,
        kv_channels=model.head_dim,
        layernorm_epsilon=model.norm_eps,
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
        **kernels,
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
                deterministic: bool = False, packed_segments: bool = False, max_row_tokens: int | None = None,
                rows: int = 1) -> list[GPTModel]:
    """This rank's model chunks (one per virtual pipeline stage), on the current device.

    `causal` picks the initial attention; `set_causal` switches it later without rebuilding anything.
    `fused_kernels=False` switches every megatron fused kernel off (else each is on where it can run).
    `packed_segments`: every batch is cut into segments (random-length samples, per-document attention): TE layers
    get them as THD, local layers as an explicit mask that already holds the causal triangle (see `set_causal`).
    `max_row_tokens` (`rows` rows per micro-batch): the longest row the model will see; local layers on packed
    segments longer than their mask allows are refused here, wherever the model is built (training, benchmarks).
    """
    model.validate_layout(parallel)
    use_te = resolve_use_te(use_te)
    config = transformer_config(model, parallel, precision, use_te, fused_kernels, deterministic, packed_segments)
    arch = architecture(model)
    vpp = parallel.virtual_pipeline_parallel
    stages = range(vpp) if vpp else [None]
    chunks = []
    for vp_stage in stages:
        gpt = GPTModel(
            config=config,
            transformer_layer_spec=arch.block_spec(model, config, use_te, vp_stage),
            vocab_size=model.padded_vocab_size(parallel.tensor_parallel),
            max_sequence_length=model.max_position_embeddings,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            share_embeddings_and_output_weights=arch.tied_embeddings,
            position_embedding_type="rope",
            rotary_base=model.rope_theta,
            rope_scaling=bool(model.rope_scaling),
            rope_scaling_factor=float((model.rope_scaling or {}).get("factor", 8.0)),
            vp_stage=vp_stage,
        )
        arch.finish(gpt, model)
        gpt.rope_theta = float(model.rope_theta)  # mlmclm.model.rope switches it in place
        gpt.uses_transformer_engine = use_te  # per-document attention: THD with TE, a mask with local layers
        gpt.packed_segments = packed_segments
        gpt.mask_carries_causality = packed_segments and not use_te
        if gpt.mask_carries_causality:
            for module in gpt.modules():
                if isinstance(module, FusedScaleMaskSoftmax):
                    module.register_forward_pre_hook(_refuse_a_missing_mask)
        gpt.to(current_device())
        chunks.append(gpt)
    if max_row_tokens is not None:
        check_local_packed_attention(chunks, max_row_tokens, model.num_attention_heads // parallel.tensor_parallel,
                                     rows)
    set_causal(chunks, causal)
    return chunks


def attention_path(chunks) -> str:
    """The attention these chunks run, as built (never as asked for: TE may have fallen back to local layers):
    "TE THD" (packed segments on TE layers), "TE padded" (whole rows on TE layers) or "local" (megatron's local
    layers: a mask, or whole rows)."""
    chunk = chunks[0]
    if getattr(chunk, "uses_transformer_engine", False):
        return "TE THD" if getattr(chunk, "packed_segments", False) else "TE padded"
    return "local"


def _refuse_a_missing_mask(softmax, args) -> None:
    """A model built for explicit masks has a non-causal softmax: called without a mask in a CLM phase it would
    attend to the future, so it refuses instead."""
    mask = args[1] if len(args) > 1 else None
    if mask is None and getattr(softmax, "phase_is_causal", False):
        raise RuntimeError("this model was built for packed segments (packed_segments=True): its local attention "
                           "takes the causality from the attention mask, and was called without one")


def set_causal(chunks, causal: bool) -> None:
    """Switch every attention layer between causal (CLM) and bidirectional (MLM); the weights are untouched.

    Local layers given an explicit mask (`mask_carries_causality`: the block-diagonal mask of packed segments, built
    causal for CLM) must not let megatron's softmax treat the layer as causal: `FusedScaleMaskSoftmax` with
    `AttnMaskType.causal` takes apex's upper-triangular kernel for fp16/bf16 inputs of 16 < keys <= 4096 and drops
    the mask given to it (`fusions/fused_softmax.py`, megatron-core 0.19), so CLM would attend across samples. Its
    mask type is then `padding` — the masked kernel, or the torch softmax, applies our mask, causal triangle
    included — while the attention's own `attn_mask_type` (unused by local attention) still says which phase it is.
    Local layers with a window (ModernBERT's, mlmclm/model/modernbert/attention.py) always pass their own mask,
    causal triangle included: their softmax is `padding` in both phases. TE's attention takes its window per phase:
    (w, 0) causal, (w, w) bidirectional, w = -1 (unbounded) on global layers.
    """
    mask_type = AttnMaskType.causal if causal else AttnMaskType.no_mask
    for chunk in chunks:
        for module in chunk.modules():
            if isinstance(module, FusedScaleMaskSoftmax):
                # The local softmax keeps its own copy and builds the causal mask from it.
                own_mask = getattr(chunk, "mask_carries_causality", False) or \
                    getattr(module, "mask_carries_causality", False)
                module.attn_mask_type = AttnMaskType.padding if own_mask else mask_type
                module.phase_is_causal = causal
            elif isinstance(getattr(module, "attn_mask_type", None), AttnMaskType):
                module.attn_mask_type = mask_type
            elif isinstance(getattr(module, "attn_mask_type", None), str) and hasattr(module, "window_size"):
                # TE's DotProductAttention keeps the mask type and window it was built with; megatron passes the
                # layer's mask type at each call, but the window would stay the build's, which TE then corrects
                # with a warning (`check_set_window_size`). Set both to what a layer built for this phase holds.
                module.attn_mask_type = "causal" if causal else "no_mask"
                window = getattr(module, "mlmclm_half_window", None)
                left = -1 if window is None else window
                module.window_size = (left, 0) if causal else (left, left)


def is_causal(chunks) -> bool:
    for chunk in chunks:
        for module in chunk.modules():
            if not isinstance(module, FusedScaleMaskSoftmax) and \
                    isinstance(getattr(module, "attn_mask_type", None), AttnMaskType):
                return module.attn_mask_type == AttnMaskType.causal
    raise ValueError("no attention layer found in the model chunks")
