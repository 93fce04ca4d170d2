"""End-to-end training on megatron-core over gloo: phases, exact resume, reshard, atomic saves, CPT, guards, logs."""
import json
import shutil

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import train_scenarios as sc
from mlmclm.parallel.launch import spawn
from mlmclm.train import checkpoint as ckpt


def metrics(run_dir):
    """step → metrics of the last time that step was logged (a resumed run re-logs the steps it redoes)."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        out[row["step"]] = row
    return out


def phase_loss(row):
    return row[f"train/{row['phase']}/loss"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return sc.make_data(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data):
    """The uninterrupted run: 2 processes at TP=2, CLM for 4 steps then MLM for 6, saving every 3 steps."""
    run_dir = tmp_path_factory.mktemp("reference")
    spawn(sc.run_recording, 2, sc.config(run_dir, data, tp=2), run_dir / "records.pt")
    return run_dir, torch.load(run_dir / "records.pt", weights_only=False)


def test_losses_decrease_within_each_objective(reference):
    run_dir, _ = reference
    rows = metrics(run_dir)
    clm = [phase_loss(rows[s]) for s in range(1, sc.SWITCH + 1)]
    mlm = [phase_loss(rows[s]) for s in range(sc.SWITCH + 1, sc.TOTAL + 1)]
    assert all(rows[s]["phase"] == "clm" for s in range(1, sc.SWITCH + 1))
    assert clm[-1] < clm[0] - 0.3
    assert sum(mlm[-2:]) / 2 < sum(mlm[:2]) / 2 - 0.3


def test_phase_switch_changes_objective_and_attention_but_carries_state(reference):
    _, records = reference
    start, switch = records["phases"]
    assert (start["index"], start["objective"], start["causal_after"]) == (0, "clm", True)
    assert (switch["index"], switch["objective"]) == (1, "mlm")
    assert switch["causal_before"] is True and switch["causal_after"] is False
    assert switch["iteration"] == sc.SWITCH
    assert switch["consumed_samples"] == sc.SWITCH * 8  # the data position carries on
    assert switch["adam_steps"] == [sc.SWITCH]  # optimizer moments carry on: nothing was reset
    assert switch["optimizer_id"] == start["optimizer_id"] and switch["model_id"] == start["model_id"]


def test_checkpoints_follow_megatron_layout_and_keep_phase_end(reference):
    run_dir, records = reference
    root = run_dir / "checkpoints"
    assert ckpt.latest_checkpoint(root) == root / f"iter_{sc.TOTAL:07d}"
    state = json.loads((root / f"iter_{sc.SWITCH:07d}" / ckpt.TRAIN_STATE).read_text())
    assert state["keep"] and state["phase_name"] == "clm" and state["iteration"] == sc.SWITCH
    assert sorted(p.name for p in root.glob("iter_*")) == [f"iter_{i:07d}" for i in (3, 4, 6, 9, 10)]


def test_tensorboard_has_the_promised_tags(reference):
    run_dir, _ = reference
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    for tag in ("train/clm/loss", "train/mlm/loss", "train/clm/accuracy", "train/mlm/accuracy", "train/lr",
                "train/grad_norm", "train/tokens", "train/phase", "perf/tokens_per_s", "perf/samples_per_s",
                "perf/tflops_per_gpu", "perf/memory_gb"):
        assert tag in scalars, tag
    assert len(events.Scalars("train/mlm/loss")) == sc.TOTAL - sc.SWITCH
    texts = " ".join(t.tensor_proto.string_val[0].decode() for t in events.Tensors("phase/text_summary"))
    assert "switch to phase 1 'mlm'" in texts


def test_crash_mid_save_keeps_previous_checkpoint_and_resume_is_exact(reference, data, tmp_path):
    ref_dir, _ = reference
    run_dir = tmp_path / "run"
    cfg = sc.config(run_dir, data, tp=2)
    with pytest.raises(Exception):
        spawn(sc.run_killed_during_save, 2, cfg, 3)  # dies while saving step 3
    root = run_dir / "checkpoints"
    assert not (root / "iter_0000003").exists() and not (root / ckpt.LATEST_FILE).exists()
    assert (root / ".staging_iter_0000003").exists()  # the torn save stayed under its temporary name

    # Second attempt dies after the step-6 checkpoint is published; the resume crosses the CLM→MLM switch.
    shutil.rmtree(run_dir)
    with pytest.raises(Exception):
        spawn(sc.run_killed_during_save, 2, cfg, 9)
    assert ckpt.latest_checkpoint(root) == root / "iter_0000006"
    spawn(sc.run_recording, 2, cfg, tmp_path / "records.pt")
    ours, ref = metrics(run_dir), metrics(ref_dir)
    assert sorted(ours) == sorted(ref)
    for step in ref:
        assert phase_loss(ours[step]) == phase_loss(ref[step]), step  # bit for bit on CPU
        assert ours[step]["train/lr"] == ref[step]["train/lr"], step


def test_resume_on_another_layout_gives_the_same_next_loss(reference, data, tmp_path):
    ref_dir, _ = reference
    run_dir = tmp_path / "resharded"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(ref_dir / "checkpoints" / "iter_0000006", run_dir / "checkpoints" / "iter_0000006")
    (run_dir / "checkpoints" / ckpt.LATEST_FILE).write_text("6")
    spawn(sc.run_until, 1, sc.config(run_dir, data, tp=1), 7)  # saved at TP=2, resumed at TP=1 on one process
    assert abs(phase_loss(metrics(run_dir)[7]) - phase_loss(metrics(ref_dir)[7])) < 1e-4


def test_cpt_keeps_weights_and_resets_optimizer_schedule_and_data(reference, data, tmp_path):
    ref_dir, records = reference
    run_dir = tmp_path / "cpt"
    cfg = sc.config(run_dir, data, tp=1, total_steps=2,
                    phases=[{"objective": {"kind": "mlm"}, "steps": 2}],
                    schedule={"style": "constant"},
                    checkpoint={"init_from": str(ref_dir / "checkpoints" / f"iter_{sc.SWITCH:07d}")})
    spawn(sc.run_cpt_recording, 1, cfg, tmp_path / "cpt.pt")
    cpt = torch.load(tmp_path / "cpt.pt", weights_only=False)
    clm = records["clm_end_weights"]
    assert cpt["initial_weights"].keys() == clm.keys()
    for name in clm:
        assert torch.equal(cpt["initial_weights"][name], clm[name]), name
    assert cpt["iteration"] == 0 and cpt["consumed_samples"] == 0 and cpt["scheduler_steps"] == 0
    assert cpt["adam_state_entries"] == 0
    assert metrics(run_dir)[1]["phase"] == "mlm"


@pytest.mark.parametrize("override, field", [
    ({"model": {"preset": "tiny", "hidden_size": 64}}, "model.hidden_size"),
    ({"data_seed": 99}, "data.seed"),
])
def test_incompatible_resume_is_refused_naming_the_field(reference, data, tmp_path, override, field):
    ref_dir, _ = reference
    run_dir = tmp_path / "run"
    shutil.copytree(ref_dir / "checkpoints", run_dir / "checkpoints")
    cfg = sc.config(run_dir, data, tp=1)
    if "data_seed" in override:
        cfg["data"]["seed"] = override["data_seed"]
    else:
        cfg.update(override)
    spawn(sc.run_and_report_error, 1, cfg, tmp_path / "error.json")
    report = json.loads((tmp_path / "error.json").read_text())
    assert report["type"] == "IncompatibleCheckpointError"
    assert field in report["message"]


def test_nan_guard_skips_then_aborts_leaving_last_checkpoint(data, tmp_path):
    run_dir = tmp_path / "nan"
    cfg = sc.config(run_dir, data, tp=1, max_consecutive_nonfinite=2,
                    checkpoint={"save_interval": 2})
    spawn(sc.run_with_nan_from, 1, cfg, 3, tmp_path / "error.json")
    report = json.loads((tmp_path / "error.json").read_text())
    assert report["type"] == "NonFiniteLossError"
    assert "aborting at step 4" in report["message"]
    rows = metrics(run_dir)
    assert rows[3]["train/skipped"] == 1 and rows[4]["train/skipped"] == 1 and rows[2]["train/skipped"] == 0
    assert ckpt.latest_checkpoint(run_dir / "checkpoints") == run_dir / "checkpoints" / "iter_0000002"
