"""`fp8_attention_decision` over architectures × head_dim × FP8 recipe × training/inference, from TE's support.

The expected table is TE's backend selection for FP8 dot-product attention (TE 2.4-2.18:
`nvte_get_fused_attn_backend` in transformer_engine/common/fused_attn/fused_attn.cpp and `get_attention_backend`
in transformer_engine/pytorch/attention/dot_product_attention/utils.py): only cuDNN's fused attention runs FP8;
it needs sm90+; on sm90 training takes head_dim 128 only, inference up to 256; on sm100 up to 128; current
scaling (tensorwise) is filtered out below sm100, MXFP8 below sm100 (and needs cuDNN >= 9.21), block scaling
always. sm100 with tensorwise/MXFP8 depends on cuDNN/TE versions nobody here has run: off, saying so.
"""
import itertools

import pytest

from mlmclm.model.precision import FP8_RECIPES, PrecisionConfig, fp8_attention_decision

CAPABILITIES = {"sm80": (8, 0), "sm90": (9, 0), "sm100": (10, 0)}
HEAD_DIMS = (64, 96, 128)
MODES = {"training": True, "inference": False}

# Every combination not listed here is off.
ON = {("sm90", 128, "delayed", "training")}
ON |= {("sm90", d, "delayed", "inference") for d in HEAD_DIMS}
ON |= {("sm100", d, "delayed", m) for d in HEAD_DIMS for m in MODES}

CASES = list(itertools.product(CAPABILITIES, HEAD_DIMS, FP8_RECIPES, MODES))


def test_the_table_covers_every_recipe_the_config_accepts():
    assert set(FP8_RECIPES) == {"delayed", "tensorwise", "mxfp8", "blockwise"}
    assert len(CASES) == 3 * 3 * 4 * 2


@pytest.mark.parametrize("arch, head_dim, recipe, mode", CASES)
def test_fp8_attention_table(arch, head_dim, recipe, mode):
    on, reason = fp8_attention_decision(CAPABILITIES[arch], head_dim, recipe, training=MODES[mode])
    assert on == ((arch, head_dim, recipe, mode) in ON), reason
    assert reason.startswith("FP8 attention on" if on else "FP8 attention off: ")
    if on:
        assert arch in reason and f"head_dim {head_dim}" in reason


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise"])
def test_the_2_1b_shape_on_h100_says_why_tensorwise_and_blockwise_fail(recipe):
    # eurobert-2.1b has head_dim 128: TE raises "no dot product attention backend" for these recipes on Hopper.
    on, reason = fp8_attention_decision((9, 0), 128, recipe, training=True)
    assert not on and "no dot product attention backend" in reason


def test_paper_head_dims_on_hopper_train_attention_in_bf16():
    for head_dim in (64, 96):
        on, reason = fp8_attention_decision((9, 0), head_dim, "delayed", training=True)
        assert not on and "head_dim 128" in reason and "bf16" in reason


def test_unverified_combinations_say_so():
    for recipe in ("tensorwise", "mxfp8"):
        on, reason = fp8_attention_decision((10, 0), 128, recipe, training=True)
        assert not on and "unverified" in reason


def test_no_device_and_unknown_recipe():
    assert fp8_attention_decision(None, 128, "delayed") == (False, "FP8 attention off: no CUDA device")
    with pytest.raises(ValueError, match="unknown FP8 recipe 'fp4'"):
        fp8_attention_decision((9, 0), 128, "fp4")
    with pytest.raises(ValueError, match="precision.fp8_recipe must be one of"):
        PrecisionConfig(fp8="hybrid", fp8_recipe="fp4")


def test_delayed_scaling_defaults_follow_nvidia_recipes_and_reach_megatron():
    from mlmclm.model import ModelConfig
    from mlmclm.model.build import transformer_config
    from mlmclm.model.precision import PrecisionConfig
    from mlmclm.parallel import ParallelConfig

    precision = PrecisionConfig()
    assert precision.fp8_scaling_kwargs() == {"fp8_amax_history_len": 1024, "fp8_amax_compute_algo": "max",
                                              "first_last_layers_bf16": False, "num_layers_at_start_in_bf16": 1,
                                              "num_layers_at_end_in_bf16": 1, "tp_only_amax_red": False}
    shape = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                        vocab_size=256, max_position_embeddings=64)
    config = transformer_config(shape, ParallelConfig(), PrecisionConfig(fp8_amax_history_len=16))
    assert (config.fp8_amax_history_len, config.fp8_amax_compute_algo) == (16, "max")
    with pytest.raises(ValueError, match="fp8_amax_history_len"):
        PrecisionConfig(fp8_amax_history_len=0)
    with pytest.raises(ValueError, match="fp8_amax_compute_algo"):
        PrecisionConfig(fp8_amax_compute_algo="mean")


def test_fp8_recipe_defaults_to_current_scaling_and_bf16_edges_need_it():
    from mlmclm.model import ModelConfig
    from mlmclm.model.build import transformer_config
    from mlmclm.parallel import ParallelConfig

    assert PrecisionConfig().fp8_recipe == "tensorwise"
    edges = PrecisionConfig(fp8="hybrid", fp8_first_last_layers_bf16=True, fp8_layers_at_end_in_bf16=2)
    kwargs = edges.fp8_scaling_kwargs()
    assert kwargs["first_last_layers_bf16"] is True and kwargs["num_layers_at_end_in_bf16"] == 2
    # Without FP8 the flag would mean nothing: megatron never sees it on.
    assert PrecisionConfig(fp8_first_last_layers_bf16=True).fp8_scaling_kwargs()["first_last_layers_bf16"] is False
    with pytest.raises(ValueError, match="fp8_first_last_layers_bf16 needs a current-scaling recipe"):
        PrecisionConfig(fp8="hybrid", fp8_recipe="delayed", fp8_first_last_layers_bf16=True)
    with pytest.raises(ValueError, match="fp8_layers_at_start_in_bf16"):
        PrecisionConfig(fp8_layers_at_start_in_bf16=-1)
    shape = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                        vocab_size=256, max_position_embeddings=64)
    config = transformer_config(shape, ParallelConfig(), PrecisionConfig(fp8_tp_only_amax_reduction=True))
    assert config.tp_only_amax_red is True
