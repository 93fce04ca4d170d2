"""Training on random-length samples with held-out validation, end to end on megatron over gloo.

One biphasic run (CLM 3 steps, MLM 3) at DP=2 is the reference (the chunked head, train_scenarios.config); the
same run at DP=1 with megatron's head, and at DP=2 crashed after step 5 and resumed from its step-4 checkpoint,
must reproduce its training and validation losses (to float rounding across layouts and heads, bit for bit across
the resume); a CLM-only and an MLM-only run must both report the CLM
and the MLM validation loss.
"""

import pytest
import torch

import train_scenarios as sc
from mlmclm.data.manifest import Manifest
from mlmclm.data.random_length import SampleLengths, sample_lengths
from mlmclm.eval.reports.tensorboard_logs import read_scalars
from mlmclm.parallel.launch import spawn
from mlmclm.train import checkpoint as ckpt

GLOBAL, TOTAL, SWITCH = 8, 6, 3
LENGTHS = {"min_length": 4, "max_length": 100}   # rows of 64: samples shorter and longer than a row
VALIDATED = [2, 3, 4, 6]   # every 2 steps, and at each phase end (3 and 6)


@pytest.fixture(scope="module")
def held_out_data(tmp_path_factory):
    """400 short documents, every 10th held out as the validation split."""
    return sc.make_held_out_data(tmp_path_factory.mktemp("rl_data"))


def config(run_dir, data, **overrides):
    cfg = sc.config(run_dir, data, tp=1, total_steps=TOTAL, global_batch_size=GLOBAL, micro_batch_size=2,
                    data={"path": str(data), "tokenizer": "embedded", "random_length": LENGTHS},
                    phases=[{"objective": {"kind": "clm"}, "steps": SWITCH},
                            {"objective": {"kind": "mlm", "mask_ratio": 0.3}, "steps": TOTAL - SWITCH}],
                    validation={"interval": 2, "samples": 8}, checkpoint={"save_interval": 2},
                    schedule={"style": "wsd", "warmup_steps": 2, "decay_steps": 2})
    cfg.update(overrides)
    return cfg


rows = sc.metrics_rows


def validation(run_dir) -> dict[int, dict]:
    return {step: {k: v for k, v in row.items() if k.startswith("val/")} for step, row in rows(run_dir).items()
            if "val/clm/loss" in row}


def run_each(configs):
    """Several runs one after the other in the same processes (each process start costs seconds)."""
    for cfg in configs:
        sc._train(cfg)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, held_out_data):
    run_dir = tmp_path_factory.mktemp("rl_reference")
    spawn(run_each, 2, [config(run_dir, held_out_data)])
    return run_dir


def test_the_split_is_recorded_and_held_out(held_out_data):
    train, split = Manifest.load(held_out_data), Manifest.load(held_out_data / "validation")
    assert train.validation["every"] == 10 and train.validation["num_documents"] == split.num_documents == 40
    assert train.num_documents == 360 and train.validation["num_samples"] == split.num_samples > 0


def test_tokens_are_the_samples_real_tokens_and_validation_is_logged(reference):
    metrics = rows(reference)
    assert sorted(metrics) == list(range(1, TOTAL + 1))   # still one row per step
    lengths = sample_lengths(1234, 0, TOTAL * GLOBAL, SampleLengths(**LENGTHS))
    for step, row in metrics.items():
        assert row["train/tokens"] == int(lengths[:step * GLOBAL].sum())   # not steps × batch × seq_length
    assert sorted(validation(reference)) == VALIDATED
    for step in VALIDATED:
        values = validation(reference)[step]
        assert set(values) == {"val/clm/loss", "val/mlm/loss", "val/clm/accuracy", "val/mlm/accuracy"}
        assert all(0 < values[f"val/{kind}/loss"] < 12 for kind in ("clm", "mlm"))
    assert validation(reference)[6]["val/mlm/loss"] < validation(reference)[2]["val/mlm/loss"]
    assert list(read_scalars(reference / "tensorboard")["mlm/loss_held_out"].steps) == VALIDATED
    final = reference / "checkpoints" / f"iter_{TOTAL:07d}"
    history = ckpt.read_json(final, ckpt.TRAIN_STATE)["validation"]
    assert [entry["step"] for entry in history] == VALIDATED
    # The exported model card reports them (the card of convert_to_hf, from this checkpoint's records).
    from types import SimpleNamespace

    from mlmclm.convert.to_hf import model_card
    from mlmclm.model.config import preset

    source = SimpleNamespace(run_config=ckpt.read_json(final, ckpt.RUN_CONFIG), path=final, model=preset("tiny"),
                             train_state=ckpt.read_json(final, ckpt.TRAIN_STATE))
    card = model_card(source, "embedded", "fp32")
    assert "## Validation (held-out documents)" in card and "MLM loss at mask ratio 0.4" in card
    for entry in history:
        assert f"| {entry['step']} | {entry['tokens']} | {entry['val/clm/loss']:.4f} | " in card


def test_dp1_and_a_resumed_dp2_run_reproduce_training_and_validation(reference, held_out_data, tmp_path):
    single, resumed = tmp_path / "dp1", tmp_path / "resumed"
    spawn(run_each, 1, [config(single, held_out_data, head_chunk_tokens=0)])  # megatron's head: same numbers
    spawn(sc.run_until, 2, config(resumed, held_out_data), 5)   # dies after step 5: resumes from step 4
    assert ckpt.latest_checkpoint(resumed / "checkpoints").name == "iter_0000004"
    spawn(run_each, 2, [config(resumed, held_out_data)])
    ref, one, again = rows(reference), rows(single), rows(resumed)
    for step in range(1, TOTAL + 1):
        loss = f"train/{ref[step]['phase']}/loss"
        assert again[step][loss] == ref[step][loss], step                      # bit for bit across the resume
        assert one[step][loss] == pytest.approx(ref[step][loss], rel=1e-5), step  # the same samples on DP 1
    assert sorted(validation(single)) == sorted(validation(resumed)) == VALIDATED
    for step in VALIDATED:
        assert validation(resumed)[step] == validation(reference)[step], step
        for key, value in validation(reference)[step].items():
            assert validation(single)[step][key] == pytest.approx(value, rel=1e-5, abs=1e-6), (step, key)


def test_clm_only_and_mlm_only_runs_report_both_validation_losses(held_out_data, tmp_path):
    single = [{"objective": {"kind": "clm"}, "steps": 2}], [{"objective": {"kind": "mlm"}, "steps": 2}]
    configs = [config(tmp_path / phases[0]["objective"]["kind"], held_out_data, phases=phases, total_steps=2,
                      validation={"interval": 1, "samples": 4}, schedule={"style": "constant"},
                      checkpoint={"save_interval": None})
               for phases in single]
    spawn(run_each, 1, configs)
    for kind in ("clm", "mlm"):
        values = validation(tmp_path / kind)
        assert sorted(values) == [1, 2], kind
        assert all(set(v) >= {"val/clm/loss", "val/mlm/loss"} for v in values.values()), kind


def test_a_pipeline_parallel_resume_continues_with_the_same_samples_and_validation(reference, held_out_data,
                                                                                   tmp_path):
    """PP=2 pads every micro-batch of a step to one length (the stages exchange fixed shapes): resumed at PP=2 from
    the reference's step-4 checkpoint (weights are initialised per layout, so only a resume can compare), steps 5-6
    and the step-6 validation follow the DP=2 reference to float rounding."""
    import shutil

    run_dir = tmp_path / "pp2"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(reference / "checkpoints" / "iter_0000004", run_dir / "checkpoints" / "iter_0000004")
    (run_dir / "checkpoints" / ckpt.LATEST_FILE).write_text("4")
    spawn(run_each, 2, [config(run_dir, held_out_data, parallel={"pipeline_parallel": 2})])
    ours, ref = rows(run_dir), rows(reference)
    assert sorted(ours) == [5, 6]
    for step in (5, 6):
        assert ours[step]["train/mlm/loss"] == pytest.approx(ref[step]["train/mlm/loss"], rel=1e-5), step
    for key, value in validation(reference)[6].items():
        assert validation(run_dir)[6][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
