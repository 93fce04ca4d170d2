"""`fp8_attention_decision` over architectures × head_dim × FP8 recipe × training/inference × attention layout, from
TE's support rules; the FP8 recipe's own GPU support; the TE version floor; the refusals at config time.

The expected table is TE's backend selection for FP8 dot-product attention (TE 2.4-2.20:
`nvte_get_fused_attn_backend` in transformer_engine/common/fused_attn/fused_attn.cpp and `get_attention_backend`
in transformer_engine/pytorch/attention/dot_product_attention/utils.py): only cuDNN's fused attention runs FP8;
it takes only the padded layouts (qkv_format bshd/sbhd), never THD; it needs sm90+; on sm90 training takes head_dim
128 only, inference up to 256; on sm100 up to 128; current scaling (tensorwise) is filtered out below sm100, MXFP8
below sm100 (and needs cuDNN >= 9.21), block scaling always. sm100 with tensorwise/MXFP8 depends on cuDNN/TE
versions nobody here has run: off, saying so.
"""
import itertools

import pytest

from mlmclm.model.precision import (ATTENTION_LAYOUTS, FP8_RECIPES, PrecisionConfig, fp8_attention_decision,
                                    fp8_recipe_error, te_version_error)

CAPABILITIES = {"sm80": (8, 0), "sm89": (8, 9), "sm90": (9, 0), "sm100": (10, 0)}
HEAD_DIMS = (64, 96, 128)
MODES = {"training": True, "inference": False}

# Every combination not listed here is off; every THD one is off.
ON = {("sm90", 128, "delayed", "training", "padded")}
ON |= {("sm90", d, "delayed", "inference", "padded") for d in HEAD_DIMS}
ON |= {("sm100", d, "delayed", m, "padded") for d in HEAD_DIMS for m in MODES}

CASES = list(itertools.product(CAPABILITIES, HEAD_DIMS, FP8_RECIPES, MODES, ATTENTION_LAYOUTS))


def test_the_table_covers_every_recipe_and_layout_the_config_accepts():
    assert set(FP8_RECIPES) == {"delayed", "tensorwise", "mxfp8", "blockwise"}
    assert set(ATTENTION_LAYOUTS) == {"padded", "thd"}
    assert len(CASES) == 4 * 3 * 4 * 2 * 2


@pytest.mark.parametrize("arch, head_dim, recipe, mode, layout", CASES)
def test_fp8_attention_table(arch, head_dim, recipe, mode, layout):
    on, reason = fp8_attention_decision(CAPABILITIES[arch], head_dim, recipe, layout, training=MODES[mode])
    assert on == ((arch, head_dim, recipe, mode, layout) in ON), reason
    assert reason.startswith("FP8 attention on" if on else "FP8 attention off: ")
    if on:
        assert arch in reason and f"head_dim {head_dim}" in reason


@pytest.mark.parametrize("arch, head_dim, recipe, mode, layout", CASES)
def test_deterministic_training_never_runs_fp8_attention(arch, head_dim, recipe, mode, layout):
    """TE's determinism filter (`get_attention_backend`, TE 2.2-2.12: always in training; TE >= 2.13: with cuDNN
    < 9.19) drops the FP8 fused backend, and FP8 rules out the others: "no dot product attention backend" at the
    first step. Inference is not filtered (TE checks `is_training`)."""
    on, reason = fp8_attention_decision(CAPABILITIES[arch], head_dim, recipe, layout, training=MODES[mode],
                                        deterministic=True)
    expected = (arch, head_dim, recipe, mode, layout) in ON and mode == "inference"
    assert on == expected, reason
    if (arch, head_dim, recipe, mode, layout) in ON and mode == "training":
        assert "deterministic" in reason and "cuDNN < 9.19" in reason and "bf16" in reason


def test_eurobert_2_1b_deterministic_on_hopper_keeps_attention_in_bf16(monkeypatch):
    """What megatron is handed for the shape the decision used to turn on (head_dim 128, delayed, padded rows):
    off when the run is deterministic; `fp8_attention: on` with `deterministic: true` is refused when read."""
    from mlmclm.model import ModelConfig
    from mlmclm.model.build import transformer_config
    from mlmclm.parallel import ParallelConfig

    _fake_hopper_with_te(monkeypatch)
    shape = ModelConfig(num_layers=2, hidden_size=256, num_attention_heads=2, num_kv_heads=2, ffn_hidden_size=96,
                        vocab_size=256, max_position_embeddings=64)
    delayed = PrecisionConfig(fp8="hybrid", fp8_recipe="delayed")
    assert transformer_config(shape, ParallelConfig(), delayed, use_te=True).fp8_dot_product_attention is True
    config = transformer_config(shape, ParallelConfig(), delayed, use_te=True, deterministic=True)
    assert config.fp8_dot_product_attention is False
    with pytest.raises(ValueError, match="deterministic training"):
        transformer_config(shape, ParallelConfig(), PrecisionConfig(fp8="hybrid", fp8_recipe="delayed",
                                                                    fp8_attention="on"),
                           use_te=True, deterministic=True)


def test_fp8_attention_on_with_deterministic_is_refused_when_the_config_is_read(tmp_path):
    from mlmclm.model import ModelConfig
    from mlmclm.objectives import ObjectiveConfig
    from mlmclm.train.config import DataConfig, PhaseConfig, TrainConfig

    shape = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                        vocab_size=256, max_position_embeddings=64)

    def config(fp8_attention, deterministic):
        return TrainConfig(run_dir=str(tmp_path), model=shape, total_steps=4, global_batch_size=2,
                           data=DataConfig(path=str(tmp_path)), deterministic=deterministic,
                           phases=[PhaseConfig(ObjectiveConfig("clm"), fraction=1.0)],
                           precision=PrecisionConfig(fp8="hybrid", fp8_recipe="delayed", fp8_attention=fp8_attention))

    config("on", False)
    config("auto", True)
    with pytest.raises(ValueError, match="fp8_attention: on cannot run with deterministic: true"):
        config("on", True)


def test_packed_thd_never_runs_fp8_attention_saying_why():
    # eurobert-2.1b (head_dim 128) on Hopper with delayed scaling: on for padded rows, off for the paper's samples.
    assert fp8_attention_decision((9, 0), 128, "delayed", "padded")[0]
    on, reason = fp8_attention_decision((9, 0), 128, "delayed", "thd")
    assert not on and "THD" in reason and "padded" in reason
    with pytest.raises(ValueError, match="unknown attention layout 'bshd'"):
        fp8_attention_decision((9, 0), 128, "delayed", "bshd")


@pytest.mark.parametrize("recipe", ["tensorwise", "blockwise"])
def test_the_2_1b_shape_on_h100_says_why_tensorwise_and_blockwise_fail(recipe):
    # eurobert-2.1b has head_dim 128: TE raises "no dot product attention backend" for these recipes on Hopper.
    on, reason = fp8_attention_decision((9, 0), 128, recipe, "padded", training=True)
    assert not on and "no dot product attention backend" in reason


def test_paper_head_dims_on_hopper_train_attention_in_bf16():
    for head_dim in (64, 96):
        on, reason = fp8_attention_decision((9, 0), head_dim, "delayed", "padded", training=True)
        assert not on and "head_dim 128" in reason and "bf16" in reason


def test_unverified_combinations_say_so():
    for recipe in ("tensorwise", "mxfp8"):
        on, reason = fp8_attention_decision((10, 0), 128, recipe, "padded", training=True)
        assert not on and "unverified" in reason


def test_no_device_and_unknown_recipe():
    assert fp8_attention_decision(None, 128, "delayed", "padded") == (False, "FP8 attention off: no CUDA device")
    with pytest.raises(ValueError, match="unknown FP8 recipe 'fp4'"):
        fp8_attention_decision((9, 0), 128, "fp4", "padded")
    with pytest.raises(ValueError, match="precision.fp8_recipe must be one of"):
        PrecisionConfig(fp8="hybrid", fp8_recipe="fp4")


# TE's GEMM support per recipe (transformer_engine/pytorch/quantization.py, TE 2.x): FP8 from sm89, MXFP8 on
# sm100-sm11x only, block scaling from sm90.
RECIPE_SUPPORTED = {("sm89", "delayed"), ("sm89", "tensorwise"),
                    *((arch, r) for arch in ("sm90", "sm100") for r in ("delayed", "tensorwise", "blockwise")),
                    ("sm100", "mxfp8")}


@pytest.mark.parametrize("arch, recipe", list(itertools.product(CAPABILITIES, FP8_RECIPES)))
def test_fp8_recipe_support_table(arch, recipe):
    error = fp8_recipe_error(CAPABILITIES[arch], recipe)
    assert (error is None) == ((arch, recipe) in RECIPE_SUPPORTED), error
    assert fp8_recipe_error((12, 0), "mxfp8") is not None  # TE: MXFP8 not on 12.0+ yet


# Block scaling by TE version, CUDA and GPU (megatron's get_fp8_recipe builds it from TE 2.3.0.dev0; TE's
# check_fp8_block_scaling_support: CUDA >= 12.9, Hopper only in TE 2.3-2.8, sm90+ from 2.9).
BLOCKWISE = [
    ("2.2.0", "12.9", (9, 0), "megatron-core builds this recipe only with Transformer Engine >= 2.3"),
    ("2.2.1", "13.0", (9, 0), ">= 2.3"),
    ("2.3.0.dev0", "12.8", (9, 0), "CUDA >= 12.9"),
    ("2.3.0", "12.9", (9, 0), None),
    ("2.3.0", "12.9", (10, 0), "Hopper only"),
    ("2.8.0", "13.0", (10, 0), "Hopper only"),
    ("2.9.0", "13.0", (10, 0), None),
    ("2.20.0.dev0", "13.0", (9, 0), None),
    ("2.20.0.dev0", "12.4", (9, 0), "CUDA >= 12.9"),
    ("2.20.0.dev0", None, (9, 0), "CUDA >= 12.9"),
]


@pytest.mark.parametrize("te, cuda, capability, error", BLOCKWISE)
def test_block_scaling_floors(te, cuda, capability, error):
    got = fp8_recipe_error(capability, "blockwise", te, cuda)
    assert (got is None) == (error is None), got
    if error:
        assert error in got and "blockwise" in got


@pytest.mark.parametrize("recipe, te, ok", [("tensorwise", "2.2.0.dev0", True), ("tensorwise", "2.1.0", False),
                                            ("delayed", "2.1.0", True), ("delayed", "2.0.0", False),
                                            ("blockwise", "2.2.0", False), ("blockwise", "2.3.0", True)])
def test_each_recipe_has_its_te_floor(recipe, te, ok):
    got = fp8_recipe_error((9, 0), recipe, te, "12.9")
    assert (got is None) == ok, got


def test_built_config_refuses_block_scaling_below_te_2_3(monkeypatch):
    """At build time, not at the first forward (megatron's ValueError there): TE's version is read as megatron
    reads it, the CUDA version is torch's."""
    from mlmclm.model import ModelConfig
    from mlmclm.model.build import transformer_config
    from mlmclm.parallel import ParallelConfig

    _fake_hopper_with_te(monkeypatch, te_version="2.2.1")
    shape = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                        vocab_size=256, max_position_embeddings=64)
    with pytest.raises(ValueError, match="Transformer Engine >= 2.3, this is TE 2.2.1"):
        transformer_config(shape, ParallelConfig(), PrecisionConfig(fp8="hybrid", fp8_recipe="blockwise"), use_te=True)
    transformer_config(shape, ParallelConfig(), PrecisionConfig(fp8="hybrid", fp8_recipe="tensorwise"), use_te=True)


@pytest.mark.parametrize("recipe, tp, expected", [("tensorwise", 1, 16), ("delayed", 2, 32), ("mxfp8", 1, 32),
                                                  ("mxfp8", 2, 64), ("blockwise", 2, 32)])
def test_random_length_padding_follows_megatrons_fp8_alignment(tmp_path, recipe, tp, expected):
    """megatron's get_fp8_align_size: 32 for MXFP8, else 16; per tensor-parallel rank (sequence parallelism)."""
    from mlmclm.data.random_length import SampleLengths
    from mlmclm.model import ModelConfig
    from mlmclm.model.precision import fp8_token_alignment
    from mlmclm.objectives import ObjectiveConfig
    from mlmclm.parallel import ParallelConfig
    from mlmclm.train.config import DataConfig, PhaseConfig, TrainConfig
    from mlmclm.train.phase_data import padding as _padding

    precision = PrecisionConfig(fp8="hybrid", fp8_recipe=recipe)
    assert fp8_token_alignment(precision) == (32 if recipe == "mxfp8" else 16)
    assert fp8_token_alignment(PrecisionConfig(fp8_recipe="mxfp8")) == 16  # no FP8: the recipe does not matter
    shape = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                        vocab_size=256, max_position_embeddings=64)
    cfg = TrainConfig(run_dir=str(tmp_path), model=shape, total_steps=4, global_batch_size=2 * tp,
                      data=DataConfig(path=str(tmp_path), random_length=SampleLengths(12, 64)),
                      phases=[PhaseConfig(ObjectiveConfig("clm"), fraction=1.0)], precision=precision,
                      parallel=ParallelConfig(tensor_parallel=tp, sequence_parallel=tp > 1))
    assert _padding(cfg)["pad_multiple"] == expected


def _fake_hopper_with_te(monkeypatch, capability=(9, 0), te_version="2.20.0"):
    from mlmclm.model import precision
    from mlmclm.parallel import runtime

    from mlmclm.model import build

    monkeypatch.setattr(precision, "transformer_engine_available", lambda: (True, "stand-in: TE on a GPU"))
    monkeypatch.setattr(build, "installed_te_version", lambda: te_version)
    monkeypatch.setattr(runtime, "gpu_capability", lambda: capability)
    # TE's fused THD RoPE present (packed segments need it): our probe, and megatron's presence check at config time.
    from megatron.core.models.common.embeddings import rope_utils

    from mlmclm.model import fusions

    monkeypatch.setattr(fusions, "probe_kernels", lambda: fusions.KernelAvailability(
        gpu=None, apex_softmax="absent", apex_wgrad="absent", jit_fuser="absent", te_rope=None))
    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb_thd", lambda *args, **kwargs: None)


def test_built_config_turns_fp8_attention_off_for_packed_segments(monkeypatch):
    """What megatron is handed: the 2.1b head size on Hopper with delayed scaling — FP8 attention for fixed rows,
    never for random-length samples / per-document attention (TE would fail at the first step)."""
    from mlmclm.model import ModelConfig
    from mlmclm.model.build import transformer_config
    from mlmclm.parallel import ParallelConfig

    _fake_hopper_with_te(monkeypatch)
    shape = ModelConfig(num_layers=2, hidden_size=256, num_attention_heads=2, num_kv_heads=2, ffn_hidden_size=96,
                        vocab_size=256, max_position_embeddings=64)
    assert shape.head_dim == 128
    delayed = PrecisionConfig(fp8="hybrid", fp8_recipe="delayed")
    assert transformer_config(shape, ParallelConfig(), delayed, use_te=True).fp8_dot_product_attention is True
    packed = transformer_config(shape, ParallelConfig(), delayed, use_te=True, packed_segments=True)
    assert packed.fp8_dot_product_attention is False
    with pytest.raises(ValueError, match="THD"):
        transformer_config(shape, ParallelConfig(), PrecisionConfig(fp8="hybrid", fp8_recipe="delayed",
                                                                    fp8_attention="on"),
                           use_te=True, packed_segments=True)
    with pytest.raises(ValueError, match="mxfp8: TE runs MXFP8 only on sm100"):
        transformer_config(shape, ParallelConfig(), PrecisionConfig(fp8="hybrid", fp8_recipe="mxfp8"), use_te=True)


def test_fp8_attention_on_with_packed_segments_is_refused_when_the_config_is_read(tmp_path):
    from mlmclm.data.random_length import SampleLengths
    from mlmclm.model import ModelConfig
    from mlmclm.objectives import ObjectiveConfig
    from mlmclm.train.config import DataConfig, PhaseConfig, TrainConfig

    shape = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                        vocab_size=256, max_position_embeddings=64)

    def config(fp8_attention, random_length=None, per_document=False):
        return TrainConfig(run_dir=str(tmp_path), model=shape, total_steps=4, global_batch_size=2,
                           data=DataConfig(path=str(tmp_path), random_length=random_length),
                           phases=[PhaseConfig(ObjectiveConfig("clm"), fraction=1.0)],
                           precision=PrecisionConfig(fp8="hybrid", fp8_recipe="delayed", fp8_attention=fp8_attention),
                           per_document_attention=per_document)

    config("on")  # fixed rows: left to the GPU's decision at build time
    config("auto", random_length=SampleLengths(12, 64))
    with pytest.raises(ValueError, match="fp8_attention: on cannot run with data.random_length.*THD"):
        config("on", random_length=SampleLengths(12, 64))
    with pytest.raises(ValueError, match="fp8_attention: on cannot run with per_document_attention"):
        config("on", per_document=True)


@pytest.mark.parametrize("version, ok", [("2.0.0", False), ("2.1.0+cu12", False), ("2.2.0.dev0", True),
                                         ("2.2.0", True), ("2.20.2", True), ("3.0", True), ("1.14.0", False)])
def test_te_version_floor(version, ok):
    error = te_version_error(version)
    assert (error is None) == ok, error
    if not ok:
        assert "2.2" in error and version in error


def test_the_gpu_extra_asks_for_the_same_te_floor():
    import re
    import tomllib
    from pathlib import Path

    from mlmclm.model.precision import TE_MIN_VERSION

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    (requirement,) = [r for r in project["optional-dependencies"]["gpu"] if r.startswith("transformer-engine")]
    floor = re.search(r">=\s*([0-9.]+)", requirement).group(1)
    assert tuple(int(x) for x in floor.split(".")[:2]) == TE_MIN_VERSION


def test_the_floor_is_checked_where_the_te_version_is_read(monkeypatch):
    """`transformer_engine_available` reads TE's version as megatron does (`__version__`) and refuses 2.1."""
    import sys
    import types

    from mlmclm.model import precision
    from mlmclm.parallel import runtime

    old_te = types.ModuleType("transformer_engine")
    old_te.__version__ = "2.1.0"
    old_te.pytorch = types.ModuleType("transformer_engine.pytorch")
    monkeypatch.setitem(sys.modules, "transformer_engine", old_te)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", old_te.pytorch)
    monkeypatch.setattr(runtime, "on_gpu", lambda: True)
    ok, why = precision.transformer_engine_available()
    assert not ok and "2.1.0 is older than 2.2" in why
    old_te.__version__ = "2.2.0"
    assert precision.transformer_engine_available()[0]


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
