"""A phase plan in a real run (megatron-core over gloo): a mask-rate schedule and a RoPE θ raised at the MLM phase.
Each MLM step trains at its scheduled rate and θ, the masks realise the rate, TensorBoard shows both, a run stopped
and resumed inside the scheduled phase (after the θ switch) is bit-identical to the uninterrupted one, and the
final checkpoint's HF export carries the raised θ and passes --verify at the model's full length."""
import json
import shutil

import pytest

import train_scenarios as sc
from mlmclm.eval.reports.tensorboard_logs import read_scalars
from mlmclm.objectives import ObjectiveConfig
from mlmclm.parallel.launch import spawn
from mlmclm.train import checkpoint as ckpt

SCHEDULE = {"kind": "mlm", "mask_ratio": 0.5, "mask_schedule": "linear", "mask_ratio_end": 0.2}
THETA, RAISED_THETA = 10_000.0, 40_000.0  # tiny-test's θ, and the MLM phase's


def config(run_dir, data):
    return sc.config(run_dir, data, phases=[{"objective": {"kind": "clm"}, "steps": sc.SWITCH},
                                            {"objective": SCHEDULE, "steps": sc.TOTAL - sc.SWITCH,
                                             "rope_theta": RAISED_THETA}])


rows = sc.metrics_rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data):
    """The uninterrupted run, and one stopped after step 8 (last save at 6, inside the scheduled phase) then
    resumed; a copy of the stopped run is resumed with another schedule. Two spawns of one process each."""
    root = tmp_path_factory.mktemp("mask_schedule")
    whole, resumed, changed = root / "whole", root / "resumed", root / "changed"
    spawn(sc.run_until, 1, config(resumed, data), 8)
    assert ckpt.latest_checkpoint(resumed / "checkpoints").name == "iter_0000006"   # inside the scheduled phase
    shutil.copytree(resumed, changed)
    other = config(changed, data)
    other["phases"][1]["objective"] = {**SCHEDULE, "mask_schedule": "cosine"}
    spawn(sc.run_each_reporting_errors, 1, [config(whole, data), config(resumed, data), other], root / "report.json")
    return whole, resumed, json.loads((root / "report.json").read_text())


def test_each_mlm_step_trains_at_its_scheduled_rate_and_realises_it(runs):
    whole, _, report = runs
    assert report[0]["status"] == "completed"
    metrics = rows(whole)
    schedule = ObjectiveConfig(**SCHEDULE)
    mlm_steps = sc.TOTAL - sc.SWITCH
    for step in range(1, sc.TOTAL + 1):
        if step <= sc.SWITCH:
            assert "train/mask_ratio" not in metrics[step]      # CLM masks nothing
            continue
        expected = schedule.ratio_at(step - sc.SWITCH - 1, mlm_steps)
        assert metrics[step]["train/mask_ratio"] == expected, step
        # 8 samples of 128 tokens per step: the realised rate is a Bernoulli mean over ~1,000 tokens
        assert abs(metrics[step]["train/mask_ratio_realised"] - expected) < 0.06, (step, metrics[step])
    assert metrics[sc.SWITCH + 1]["train/mask_ratio"] == 0.5 and metrics[sc.TOTAL]["train/mask_ratio"] == 0.2
    first, last = metrics[sc.SWITCH + 1]["train/mask_ratio_realised"], metrics[sc.TOTAL]["train/mask_ratio_realised"]
    assert first > last + 0.2                                   # the masks follow the schedule down
    scalars = read_scalars(whole / "tensorboard")
    assert list(scalars["progress/mask_ratio"].steps) == list(range(sc.SWITCH + 1, sc.TOTAL + 1))
    assert "progress/mask_ratio_realised" in scalars and "progress/phase" in scalars


def test_a_resume_inside_the_scheduled_phase_is_bit_identical(runs):
    whole, resumed, report = runs
    assert report[1]["status"] == "completed"
    assert ckpt.latest_checkpoint(resumed / "checkpoints").name == f"iter_{sc.TOTAL:07d}"
    ref, again = rows(whole), rows(resumed)
    for step in range(1, sc.TOTAL + 1):
        loss = f"train/{ref[step]['phase']}/loss"
        assert again[step][loss] == ref[step][loss], step
        assert again[step].get("train/mask_ratio_realised") == ref[step].get("train/mask_ratio_realised"), step


def test_a_resume_that_changes_the_schedule_is_refused_naming_the_field(runs):
    _, _, report = runs
    assert report[2]["type"] == "IncompatibleCheckpointError"
    assert "phases.1.objective.mask_schedule is 'linear' in the checkpoint but 'cosine'" in report[2]["message"]


def test_the_mlm_phase_trains_at_its_raised_theta_and_tensorboard_shows_it(runs):
    whole, _, _ = runs
    metrics = rows(whole)
    assert [metrics[s]["train/rope_theta"] for s in range(1, sc.TOTAL + 1)] == \
        [THETA] * sc.SWITCH + [RAISED_THETA] * (sc.TOTAL - sc.SWITCH)
    assert {metrics[s]["train/context_length"] for s in metrics} == {sc.SEQ}   # the prepared rows
    scalars = read_scalars(whole / "tensorboard")
    assert list(scalars["progress/rope_theta"].values) == [THETA] * sc.SWITCH + [RAISED_THETA] * (sc.TOTAL - sc.SWITCH)
    assert "progress/context_length" in scalars
    state = ckpt.read_json(ckpt.latest_checkpoint(whole / "checkpoints"), ckpt.TRAIN_STATE)
    assert state["rope_theta"] == RAISED_THETA
    clm_end = ckpt.read_json(whole / "checkpoints" / f"iter_{sc.SWITCH:07d}", ckpt.TRAIN_STATE)
    assert clm_end["rope_theta"] == THETA                     # the phase-end checkpoint of the CLM phase


def test_the_export_carries_the_raised_theta_and_verifies_at_full_length(runs, tmp_path):
    from transformers import AutoConfig

    from mlmclm.convert.to_hf import ExportConfig, convert_to_hf

    whole, _, _ = runs
    summary = convert_to_hf(ExportConfig(whole, tmp_path / "hf", verify=True, verify_length=1024, progress=False))
    assert summary.max_abs_diff is not None and summary.max_abs_diff <= 1e-4
    hf = AutoConfig.from_pretrained(tmp_path / "hf")
    assert hf.rope_parameters["rope_theta"] == RAISED_THETA and hf.max_position_embeddings == 1024
