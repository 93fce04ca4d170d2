"""End-to-end training on megatron-core over gloo: phases, exact resume, reshard, atomic saves, CPT, guards, logs."""
import json
import math
import re
import shutil

import pytest
import torch

import train_scenarios as sc
from mlmclm.eval.reports.tensorboard_logs import read_scalars
from mlmclm.parallel.launch import spawn
from mlmclm.tensorboard_tags import tensorboard_tag
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


def test_each_step_reads_the_device_once(reference):
    """One host synchronisation per step (issue #12): the loss statistics, the gradient norm that is also the
    non-finite guard, and the stop flag come back in one read; megatron's own norm read and a separate guard and
    stop read are gone. The sparse head's positions are found on the host before the batch goes over."""
    _, records = reference
    reads = records["host_reads"]
    assert len(reads) == sc.TOTAL
    assert all(calls == ["tolist"] for calls in reads), reads


def test_checkpoints_follow_megatron_layout_and_keep_phase_end(reference):
    run_dir, records = reference
    root = run_dir / "checkpoints"
    assert ckpt.latest_checkpoint(root) == root / f"iter_{sc.TOTAL:07d}"
    state = json.loads((root / f"iter_{sc.SWITCH:07d}" / ckpt.TRAIN_STATE).read_text())
    assert state["keep"] and state["phase_name"] == "clm" and state["iteration"] == sc.SWITCH
    assert sorted(p.name for p in root.glob("iter_*")) == [f"iter_{i:07d}" for i in (3, 4, 6, 9, 10)]


def test_tensorboard_has_the_promised_tags(reference):
    run_dir, _ = reference
    scalars = read_scalars(run_dir / "tensorboard")
    for key in ("train/clm/loss", "train/mlm/loss", "train/clm/accuracy", "train/mlm/accuracy", "train/lr",
                "train/grad_norm", "train/tokens", "train/phase", "perf/tokens_per_s", "perf/samples_per_s",
                "perf/tflops_per_gpu", "perf/memory_gb"):
        assert tensorboard_tag(key) in scalars, key
    assert len(scalars["mlm/loss"].steps) == sc.TOTAL - sc.SWITCH
    assert not any(tag.startswith("final/") for tag in scalars) and "performance/mfu" not in scalars


def test_tensorboard_names_the_run_and_gives_each_phase_its_own_run(reference):
    """What TensorBoard itself makes of the folder (its own multiplexer names the runs as `tensorboard --logdir`
    does): the run under the run directory's name, each phase a run below it (TensorBoard colours by run, so CLM
    and MLM get a colour each), no run called "."; the losses sort first in Time Series; the Custom Scalars charts
    and the HParams metrics name tags that exist where they are looked up."""
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
    from tensorboard.plugins.custom_scalar import layout_pb2
    from tensorboard.plugins.hparams import plugin_data_pb2

    run_dir, _ = reference
    name = run_dir.name
    multiplexer = EventMultiplexer().AddRunsFromDirectory(str(run_dir / "tensorboard"))
    multiplexer.Reload()
    assert set(multiplexer.Runs()) == {name, f"{name}/clm", f"{name}/mlm"}, set(multiplexer.Runs())
    tags = {run: set(tag_map) for run, tag_map in multiplexer.PluginRunToTagToContent("scalars").items()}
    assert tags[f"{name}/clm"] == tags[f"{name}/mlm"] == {"loss", "token_accuracy"}  # (this run holds no data out)
    assert {"optimisation/lr", "performance/tokens_per_s", "progress/tokens"} <= tags[name]
    assert not tags[name] & {"loss", "token_accuracy"}
    assert [e.step for e in multiplexer.Tensors(f"{name}/clm", "loss")] == list(range(1, sc.SWITCH + 1))
    # Time Series: groups (the part before the first '/') in alphabetical order, the losses first.
    groups = sorted({tag.split("/")[0] for run_tags in tags.values() for tag in run_tags})
    assert groups[0] == "loss" and groups[-1] == "token_accuracy", groups
    texts = " ".join(t.tensor_proto.string_val[0].decode() for t in multiplexer.Tensors(name, "phase/text_summary"))
    assert "switch to phase 1 'mlm'" in texts

    layout = layout_pb2.Layout.FromString(
        multiplexer.Tensors(name, "custom_scalars__config__")[0].tensor_proto.string_val[0])
    charts = {(category.title, chart.title): list(chart.multiline.tag)
              for category in layout.category for chart in category.chart}
    assert ("throughput", "MFU") not in charts

    def drawn(chart) -> set:  # (run, tag) pairs a chart draws: the plugin matches each regex against every tag
        return {(run, tag) for run, run_tags in tags.items() for tag in run_tags
                for regex in charts[chart] if re.match(regex, tag)}

    assert drawn(("objectives", "loss")) == {(f"{name}/clm", "loss"), (f"{name}/mlm", "loss")}
    assert charts["validation", "loss"] == ["^loss_held_out$"]   # what the held-out runs write (test_random_length_run)
    assert drawn(("optimisation", "lr")) == {(name, "optimisation/lr")}
    assert drawn(("throughput", "tokens/s")) == {(name, "performance/tokens_per_s")}

    hparams = [plugin_data_pb2.HParamsPluginData.FromString(content)
               for content in multiplexer.PluginRunToTagToContent("hparams")[name].values()]
    metrics = {(m.name.group, m.name.tag) for h in hparams if h.HasField("experiment")
               for m in h.experiment.metric_infos}
    assert metrics == {("clm", "loss"), ("mlm", "loss")}
    # the plugin reads a metric from the run session/group: each one names a tag that exists there
    assert all(tag in tags[f"{name}/{group}" if group else name] for group, tag in metrics), metrics


def test_torn_save_is_removed_and_a_resume_from_before_the_switch_is_exact(reference, data, tmp_path):
    ref_dir, _ = reference
    run_dir = tmp_path / "run"
    cfg = sc.config(run_dir, data, tp=2)
    with pytest.raises(Exception):
        spawn(sc.run_killed_during_save, 2, cfg, 3)  # dies while saving step 3
    root = run_dir / "checkpoints"
    assert not (root / "iter_0000003").exists() and not (root / ckpt.LATEST_FILE).exists()
    assert (root / ".staging_iter_0000003").exists()  # the torn save stayed under its temporary name

    # The next attempt starts afresh, removes the torn save, and dies right after logging step 4 — before that
    # step's phase-end save — so the latest checkpoint is step 3, still in the CLM phase.
    spawn(sc.run_until, 2, cfg, sc.SWITCH)
    assert not list(root.glob(".staging_*"))
    assert ckpt.latest_checkpoint(root) == root / "iter_0000003"

    spawn(sc.run_recording, 2, cfg, tmp_path / "records.pt")  # resumes at step 3 and crosses the switch
    records = torch.load(tmp_path / "records.pt", weights_only=False)
    assert [(p["index"], p["iteration"]) for p in records["phases"]] == [(0, 3), (1, sc.SWITCH)]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, sc.TOTAL + 1))  # the crashed attempt's step 4 was rewound: one row per step
    ours, ref = metrics(run_dir), metrics(ref_dir)
    for step in ref:
        assert phase_loss(ours[step]) == phase_loss(ref[step]), step  # bit for bit on CPU
        assert ours[step]["train/lr"] == ref[step]["train/lr"], step


@pytest.fixture(scope="module")
def reference_tp2_pp2(tmp_path_factory, data):
    """The same run at TP=2 × PP=2 on 4 processes, stopped after step 8 (checkpoints at 3, 4 and 6)."""
    run_dir = tmp_path_factory.mktemp("tp2pp2")
    spawn(sc.run_until, 4, sc.config(run_dir, data, parallel={"tensor_parallel": 2, "pipeline_parallel": 2}), 8)
    return run_dir


def test_resume_from_tp2_pp2_on_one_process_continues_the_run(reference_tp2_pp2, data, tmp_path):
    run_dir = tmp_path / "resharded"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(reference_tp2_pp2 / "checkpoints" / "iter_0000006", run_dir / "checkpoints" / "iter_0000006")
    (run_dir / "checkpoints" / ckpt.LATEST_FILE).write_text("6")
    # Saved at TP2·PP2 with the chunked head, resumed at TP1·PP1 with megatron's (a speed setting may change).
    spawn(sc.run_until, 1, sc.config(run_dir, data, tp=1, head_chunk_tokens=0), 8)
    ours, ref = metrics(run_dir), metrics(reference_tp2_pp2)
    for step in (7, 8):  # the second step shows the resharded Adam moments, not just the weights
        assert ours[step]["train/lr"] == ref[step]["train/lr"], step
        assert phase_loss(ours[step]) == pytest.approx(phase_loss(ref[step]), abs=1e-4), step
        assert ours[step]["train/grad_norm"] == pytest.approx(ref[step]["train/grad_norm"], rel=1e-3), step


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
    assert_steps_start_from_loaded_weights(cpt, lr=cfg["optimizer"]["lr"])


def assert_steps_start_from_loaded_weights(cpt: dict, lr: float) -> None:
    """After k steps every weight is within k Adam updates (|update| <= ~lr each) of the loaded one, plus bf16
    rounding: the run trains the loaded model, not a fresh initialisation."""
    start = cpt["initial_weights"]
    assert cpt["weights_after_step"], "no step recorded"
    for k, weights in enumerate(cpt["weights_after_step"], start=1):
        for name, tensor in weights.items():
            allowed = k * 1.5 * lr + start[name].abs() * 2 ** -7 + 1e-6
            worst = ((tensor - start[name]).abs() - allowed).max().item()
            assert worst <= 0, f"{name} after step {k}: moved {worst:.3g} beyond {k} updates from the loaded weights"


@pytest.mark.parametrize("override, field", [
    ({"model": {"preset": "tiny", "hidden_size": 64}}, "model.hidden_size"),
    ({"seed": 99}, "seed"),  # every MLM mask derives from it
])
def test_incompatible_resume_is_refused_naming_the_field(reference, data, tmp_path, override, field):
    ref_dir, _ = reference
    run_dir = tmp_path / "run"
    shutil.copytree(ref_dir / "checkpoints", run_dir / "checkpoints")
    cfg = sc.config(run_dir, data, tp=1)
    cfg.update(override)
    spawn(sc.run_and_report_error, 1, cfg, tmp_path / "error.json")
    report = json.loads((tmp_path / "error.json").read_text())
    assert report["type"] == "IncompatibleCheckpointError"
    assert field in report["message"]


def test_nan_guard_skips_then_aborts_leaving_last_checkpoint(data, tmp_path):
    run_dir = tmp_path / "nan"
    cfg = sc.config(run_dir, data, tp=1, max_consecutive_nonfinite=2,
                    checkpoint={"save_interval": 2})
    spawn(sc.run_with_nan_at, 1, cfg, set(range(3, sc.TOTAL + 1)), tmp_path / "error.json")
    report = json.loads((tmp_path / "error.json").read_text())
    assert report["type"] == "NonFiniteLossError"
    assert "aborting at step 4" in report["message"]
    rows = metrics(run_dir)
    assert rows[3]["train/skipped"] == 1 and rows[4]["train/skipped"] == 1 and rows[2]["train/skipped"] == 0
    assert ckpt.latest_checkpoint(run_dir / "checkpoints") == run_dir / "checkpoints" / "iter_0000002"


def test_a_skipped_step_at_a_phase_end_still_saves_the_phase_end_checkpoint(data, tmp_path):
    """Also: a step whose loss is finite but one gradient is not is skipped too (the guard reads the gradient
    norm, `mlmclm.train.guarded_update`), and the run carries on."""
    run_dir = tmp_path / "nan_at_switch"
    spawn(sc.run_with_nan_at, 1, sc.config(run_dir, data, tp=1), {sc.SWITCH}, tmp_path / "error.json",
          {sc.SWITCH + 2})
    assert json.loads((tmp_path / "error.json").read_text())["type"] is None  # one skipped step: the run goes on
    rows = metrics(run_dir)
    assert rows[sc.SWITCH]["train/skipped"] == 1 and rows[sc.TOTAL]["train/skipped"] == 0
    bad_gradient = rows[sc.SWITCH + 2]
    assert bad_gradient["train/skipped"] == 1 and math.isfinite(phase_loss(bad_gradient))
    assert rows[sc.SWITCH + 1]["train/skipped"] == 0 and rows[sc.SWITCH + 3]["train/skipped"] == 0
    state = json.loads((run_dir / "checkpoints" / f"iter_{sc.SWITCH:07d}" / ckpt.TRAIN_STATE).read_text())
    assert state["keep"] and state["phase_name"] == "clm"  # the CPT starting point exists


def test_a_blend_of_datasets_trains_and_checkpoints_its_position(data, tmp_path):
    """Wiring only (the blend's order, proportions and resume are tested in tests/data): `data.blend` replaces
    `data.path`, and the checkpoint carries the blend's loader state."""
    other = sc.make_data(tmp_path / "other")
    run_dir = tmp_path / "blend"
    cfg = sc.config(run_dir, data, tp=1, total_steps=3, phases=[{"objective": {"kind": "mlm"}, "steps": 3}],
                    schedule={"style": "constant"})
    cfg["data"] = {"blend": {str(data): 0.75, str(other): 0.25}, "tokenizer": "embedded"}
    spawn(sc.run_and_report_error, 1, cfg, tmp_path / "error.json")
    assert json.loads((tmp_path / "error.json").read_text())["type"] is None
    state = json.loads((run_dir / "checkpoints" / "iter_0000003" / ckpt.TRAIN_STATE).read_text())
    [blend] = state["loaders"]  # the run's one data source, for its one phase
    assert blend["kind"] == "blend" and blend["consumed_samples"] == 3 * 8
    assert sum(d["consumed_samples"] for d in blend["datasets"]) == 3 * 8
