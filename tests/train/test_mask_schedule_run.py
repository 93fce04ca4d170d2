"""A mask-rate schedule in a real run (megatron-core over gloo): each MLM step trains at its scheduled rate, the
masks realise it, TensorBoard shows it, and a run stopped and resumed inside the scheduled phase is bit-identical
to the uninterrupted one."""
import json
import shutil

import pytest

import train_scenarios as sc
from mlmclm.eval.tensorboard_logs import read_scalars
from mlmclm.objectives import ObjectiveConfig
from mlmclm.parallel.launch import spawn
from mlmclm.train import checkpoint as ckpt

SCHEDULE = {"kind": "mlm", "mask_ratio": 0.5, "mask_schedule": "linear", "mask_ratio_end": 0.2}


def config(run_dir, data):
    return sc.config(run_dir, data, phases=[{"objective": {"kind": "clm"}, "steps": sc.SWITCH},
                                            {"objective": SCHEDULE, "steps": sc.TOTAL - sc.SWITCH}])


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
