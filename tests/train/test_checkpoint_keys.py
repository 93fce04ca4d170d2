"""Strict, spec-independent checkpoint loading: a local-spec checkpoint loads into a model with Transformer Engine's
state-dict keys (a CPU stand-in, see te_standin.py) and back — the `_extra_state` entries being the one tolerated
difference — while a genuinely different model is refused naming the keys. The TE-keyed checkpoint also exports to
Hugging Face."""
import json

import pytest

import train_scenarios as sc
from mlmclm.parallel.launch import spawn


@pytest.fixture(scope="module")
def report(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("keys")
    spawn(sc.run_checkpoint_key_checks, 1, sc.config(root / "run", data), root / "ckpts", root / "report.json")
    return json.loads((root / "report.json").read_text())


def test_the_te_keyed_checkpoint_differs_from_a_local_one_by_extra_state_only(report):
    """Where the difference lies (megatron-core 0.19.2): local linears already store an empty `_extra_state`; TE's
    final norm stores one the local norm lacks; TE attention has one in its state dict that megatron leaves out of
    dist checkpoints — so a TE model loading any dist checkpoint meets a missing `_extra_state`."""
    assert "decoder.layers.0.self_attention.core_attention._extra_state" in report["te_model_extra_state"]
    assert "decoder.final_layernorm._extra_state" in report["te_model_extra_state"]
    local, te = set(report["local_checkpoint_extra_state"]), set(report["te_checkpoint_extra_state"])
    assert "decoder.layers.self_attention.linear_qkv._extra_state" in local & te
    assert te - local == {"decoder.final_layernorm._extra_state"}
    assert not any("core_attention" in key for key in te)


def test_local_checkpoint_loads_into_te_keys_and_back(report):
    assert report["local_to_te_same_weights"]
    assert report["te_to_local_same_weights"]


def test_a_delayed_scaling_checkpoint_resumes_under_te_2_18s_extra_state_rule(report):
    """TE >= 2.18 refuses delayed-scaling extra state unless NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1 (the stand-in
    applies its rule, tests/stand_ins/te/transformer_engine/pytorch/_extra_state.py). Our vetted, re-pickled copies
    reach TE through that opt-in for the one load call; the variable is unset again afterwards. (Old code: every
    such resume raised TE's "Refusing to load pickled Transformer Engine extra state".)"""
    assert report["fp8_meta_modules"] >= 4 * 2 + 1  # 4 linears per layer, 2 layers, the final norm
    assert report["te_resume_same_weights"]
    # Attention's FP8 metadata is the one megatron leaves out of dist checkpoints (see te_standin.py): it starts
    # fresh, as with TE; every other module's is restored.
    for differs in (report["te_resume_fp8_meta_differs"], report["te_init_from_fp8_meta_differs"]):
        assert differs and all(name.endswith("core_attention") for name in differs), differs
    assert report["te_opt_in_after_loads"] is None


def test_a_different_model_is_refused_naming_the_keys(report):
    assert "missing from the checkpoint: decoder.layers.self_attention.linear_proj.bias" in report["refused_missing"]
    assert "in the checkpoint but not in this model: decoder.layers.self_attention.linear_proj.bias" in \
        report["refused_unexpected"]


def test_a_te_keyed_checkpoint_exports_to_hugging_face(report, tmp_path):
    from mlmclm.convert.to_hf import ExportConfig, convert_to_hf

    summary = convert_to_hf(ExportConfig(report["te_path"], tmp_path / "hf", verify=True, progress=False))
    assert summary.max_abs_diff is not None and summary.max_abs_diff <= 1e-4
