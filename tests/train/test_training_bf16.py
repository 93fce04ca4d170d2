"""The GPU regime on CPU: bf16 parameters with fp32 main parameters and gradients in megatron's distributed
optimizer, sharded over 2 data-parallel ranks — megatron's real code path (`Float16` main-param copies, the
distributed optimizer's shard of them, its reshardable checkpoint), over gloo.

It asserts what the fp32 tier asserts where the two paths differ: training, exact resume across the phase switch,
resharding DP2 → DP1 (main parameters and Adam moments re-partitioned), continued pretraining (the fp32 main copy
must hold the loaded weights, not the random initialisation), and the Hugging Face export of a bf16 checkpoint.
"""
import json
import shutil

import pytest
import torch

import train_scenarios as sc
from mlmclm.parallel.launch import spawn
from mlmclm.train import checkpoint as ckpt
from test_training_run import assert_steps_start_from_loaded_weights, metrics, phase_loss

BF16 = {"precision": {"dtype": "bf16"}}


def bf16_config(run_dir, data, dp=2, **overrides):
    return sc.config(run_dir, data, tp=1, **BF16, **overrides)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data):
    """Uninterrupted bf16 run on 2 processes: DP=2, distributed optimizer, CLM 4 steps then MLM 6."""
    run_dir = tmp_path_factory.mktemp("reference_bf16")
    spawn(sc.run_recording, 2, bf16_config(run_dir, data), run_dir / "records.pt")
    return run_dir, torch.load(run_dir / "records.pt", weights_only=False)


def test_bf16_parameters_train_and_checkpoint_fp32_main_parameters(reference):
    run_dir, records = reference
    rows = metrics(run_dir)
    clm = [phase_loss(rows[s]) for s in range(1, sc.SWITCH + 1)]
    mlm = [phase_loss(rows[s]) for s in range(sc.SWITCH + 1, sc.TOTAL + 1)]
    assert clm[-1] < clm[0] - 0.3 and sum(mlm[-2:]) / 2 < sum(mlm[:2]) / 2 - 0.3
    assert all(t.dtype == torch.float32 for t in records["clm_end_weights"].values())  # gathered as float
    saved = json.loads((run_dir / "checkpoints" / f"iter_{sc.TOTAL:07d}" / ckpt.RUN_CONFIG).read_text())
    assert saved["precision"]["dtype"] == "bf16"
    # The checkpoint holds the fp32 main parameters next to the bf16 weights (the reshardable optimizer layout).
    from megatron.core.dist_checkpointing.serialization import load_sharded_metadata

    stored = load_sharded_metadata(str(run_dir / "checkpoints" / f"iter_{sc.TOTAL:07d}"))
    assert stored["decoder.layers.mlp.linear_fc1.weight"].dtype == torch.bfloat16
    assert stored["optimizer.state.param.decoder.layers.mlp.linear_fc1.weight"].dtype == torch.float32


def test_bf16_steps_read_the_device_once(reference):
    """The GPU regime's step (bf16 parameters, fp32 main gradients sharded over DP=2) also reads the device once:
    loss statistics, the gradient norm that is the non-finite guard, and the stop flag, together."""
    _, records = reference
    assert len(records["host_reads"]) == sc.TOTAL
    assert all(calls == ["tolist"] for calls in records["host_reads"]), records["host_reads"]


def test_bf16_resume_from_before_the_switch_is_exact(reference, data, tmp_path):
    ref_dir, _ = reference
    run_dir = tmp_path / "run"
    cfg = bf16_config(run_dir, data)
    spawn(sc.run_until, 2, cfg, sc.SWITCH)  # dies after step 4, before its save: resumes from step 3
    assert ckpt.latest_checkpoint(run_dir / "checkpoints").name == "iter_0000003"
    spawn(sc.run_recording, 2, cfg, tmp_path / "records.pt")
    ours, ref = metrics(run_dir), metrics(ref_dir)
    assert sorted(ours) == sorted(ref)
    for step in ref:
        assert phase_loss(ours[step]) == phase_loss(ref[step]), step  # bit for bit, fp32 main params restored
        assert ours[step]["train/grad_norm"] == ref[step]["train/grad_norm"], step


def test_bf16_resume_from_dp2_on_one_process_continues_the_run(reference, data, tmp_path):
    ref_dir, _ = reference
    run_dir = tmp_path / "dp1"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(ref_dir / "checkpoints" / "iter_0000006", run_dir / "checkpoints" / "iter_0000006")
    (run_dir / "checkpoints" / ckpt.LATEST_FILE).write_text("6")
    spawn(sc.run_until, 1, bf16_config(run_dir, data), 8)
    ours, ref = metrics(run_dir), metrics(ref_dir)
    for step in (7, 8):  # bf16 forward: agreement to bf16 precision, not bit for bit
        assert ours[step]["train/lr"] == ref[step]["train/lr"], step
        assert phase_loss(ours[step]) == pytest.approx(phase_loss(ref[step]), abs=2e-2), step
        assert ours[step]["train/grad_norm"] == pytest.approx(ref[step]["train/grad_norm"], rel=5e-2), step


def test_bf16_continued_pretraining_trains_the_loaded_weights(reference, data, tmp_path):
    """The bug this guards: the optimizer's fp32 main copy kept the random init and overwrote the loaded weights
    at the first update (loss back to ln(vocab) at step 2)."""
    ref_dir, records = reference
    run_dir = tmp_path / "cpt"
    cfg = bf16_config(run_dir, data, total_steps=3, phases=[{"objective": {"kind": "mlm"}, "steps": 3}],
                      schedule={"style": "constant"},
                      checkpoint={"init_from": str(ref_dir / "checkpoints" / f"iter_{sc.SWITCH:07d}")})
    spawn(sc.run_cpt_recording, 1, cfg, tmp_path / "cpt.pt")
    cpt = torch.load(tmp_path / "cpt.pt", weights_only=False)
    for name, tensor in records["clm_end_weights"].items():
        assert torch.equal(cpt["initial_weights"][name], tensor), name
    assert_steps_start_from_loaded_weights(cpt, lr=cfg["optimizer"]["lr"])
    rows = metrics(run_dir)
    assert max(phase_loss(rows[s]) for s in (2, 3)) < phase_loss(rows[1]) + 0.3


def test_bf16_checkpoint_exports_to_hugging_face_and_verifies(reference, tmp_path):
    from mlmclm.convert.to_hf import ExportConfig, convert_to_hf

    ref_dir, _ = reference
    summary = convert_to_hf(ExportConfig(ref_dir, tmp_path / "hf", verify=True, progress=False))
    assert summary.iteration == sc.TOTAL
    assert summary.max_abs_diff is not None and summary.max_abs_diff <= 1e-4  # HF logits = ours on the same input
