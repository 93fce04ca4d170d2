"""Fused kernels are switched on only where their kernel can be imported for the spec in use."""
import logging

import pytest
import torch

from mlmclm.model.fusions import KernelAvailability, decide_fusions, fusion_flags, probe_kernels

ALL = ("masked_softmax_fusion", "gradient_accumulation_fusion", "bias_activation_fusion", "bias_dropout_fusion",
       "cross_entropy_loss_fusion", "apply_rope_fusion", "persist_layer_norm")


def gpu(**missing) -> KernelAvailability:
    """A GPU machine with every kernel available except the named ones (value: the reason)."""
    fields = dict(gpu=None, apex_softmax=None, apex_wgrad=None, jit_fuser=None, te_rope=None)
    return KernelAvailability(**{**fields, **missing})


def on(flags) -> set[str]:
    return {name for name in ALL if getattr(flags, name).on}


def test_makefile_venv_gpu_run_no_longer_sets_masked_softmax_fusion():
    # `make gpu-check` in the Makefile venv: a GPU, PyPI torch (triton, gcc), no apex, no TE -> local spec.
    # The old build set masked_softmax_fusion=True here, and megatron imported apex's kernel at the first forward.
    flags = decide_fusions(gpu(apex_softmax="scaled_masked_softmax_cuda not importable (ModuleNotFoundError)",
                               apex_wgrad="fused_weight_gradient_mlp_cuda not importable (ModuleNotFoundError)",
                               te_rope="TE fused RoPE not importable (ImportError)"), use_te=False)
    assert on(flags) == {"bias_activation_fusion", "bias_dropout_fusion", "cross_entropy_loss_fusion"}
    assert "scaled_masked_softmax_cuda" in flags.masked_softmax_fusion.reason
    assert flags.config_kwargs()["masked_softmax_fusion"] is False
    assert flags.config_kwargs()["cross_entropy_fusion_impl"] == "native"  # TE's variant has known issues


def test_ngc_container_turns_on_what_it_has():
    # NGC image: apex (softmax and wgrad kernels), TE, triton. With TE layers the softmax flag is not read at all.
    te = decide_fusions(gpu(), use_te=True)
    assert on(te) == set(ALL) - {"masked_softmax_fusion", "persist_layer_norm"}
    assert "TE" in te.masked_softmax_fusion.reason
    local = decide_fusions(gpu(), use_te=False)
    assert on(local) == set(ALL) - {"persist_layer_norm"}


@pytest.mark.parametrize("missing, off", [
    (dict(apex_wgrad="no apex"), {"gradient_accumulation_fusion"}),  # the LM head needs apex even with TE
    (dict(jit_fuser="no triton"), {"bias_activation_fusion", "bias_dropout_fusion", "cross_entropy_loss_fusion"}),
    (dict(te_rope="no TE"), {"apply_rope_fusion"}),
])
def test_each_missing_kernel_turns_off_exactly_its_flags(missing, off):
    flags = decide_fusions(gpu(**missing), use_te=True)
    assert set(ALL) - on(flags) == off | {"masked_softmax_fusion", "persist_layer_norm"}
    assert all(getattr(flags, name).reason == next(iter(missing.values())) for name in off)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU answer")
def test_on_cpu_every_probe_says_no_device_and_every_flag_is_off(caplog):
    avail = probe_kernels()
    assert avail.gpu == "no CUDA device"
    with caplog.at_level(logging.INFO, logger="mlmclm.model.fusions"):
        flags = fusion_flags(use_te=False)
    assert on(flags) == set()
    (line,) = [r.getMessage() for r in caplog.records if r.name == "mlmclm.model.fusions"]
    assert line.startswith("fused kernels (local spec): on: none; off: ")
    assert all(name in line for name in ALL)  # one line names every flag


def test_real_import_probes_answer_for_this_machine():
    # The real import checks (no device shortcut): each answers as importlib sees this machine.
    import importlib.util

    from mlmclm.model import fusions

    assert fusions._import_error("torch") is None
    for name in fusions.APEX_SOFTMAX_MODULES + (fusions.APEX_WGRAD_MODULE,):
        error = fusions._import_error(name)
        if importlib.util.find_spec(name) is None:
            assert error == f"{name} not importable (ModuleNotFoundError)"
    if importlib.util.find_spec("transformer_engine") is None:
        assert fusions._te_rope_error() is not None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU answer")
def test_the_fallback_from_transformer_engine_to_local_layers_is_logged(caplog):
    from mlmclm.model.build import resolve_use_te

    with caplog.at_level(logging.INFO, logger="mlmclm.model.build"):
        assert resolve_use_te(None) is False
    assert any("layer spec: megatron local layers, not Transformer Engine (no CUDA device)" in r.getMessage()
               for r in caplog.records)
    with pytest.raises(ValueError, match="Transformer Engine layers requested but unavailable: no CUDA device"):
        resolve_use_te(True)


def test_fused_kernels_false_switches_every_flag_off_even_where_kernels_exist():
    flags = fusion_flags(use_te=True, avail=gpu(), enabled=False)
    assert on(flags) == set()
    assert all("fused_kernels=false" in getattr(flags, name).reason for name in ALL)
