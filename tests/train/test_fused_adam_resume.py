"""Resume under Transformer Engine's FusedAdam — the optimizer megatron builds on GPU images with TE — through its
CPU stand-in (fused_adam_standin.py), in the GPU regime (bf16 parameters, fp32 main parameters, distributed optimizer
over DP=2): exact resume across the CLM→MLM switch, a checkpoint of torch's AdamW resumed under TE and back,
DP2→DP1 resharding and continued pretraining. Also: Python's `random` and numpy's generator continue across a
resume (their states are in the checkpoint).

What these guard, as seen on the old code: adding torch Adam's per-parameter `step` on load made TE's `state_dict`
raise KeyError: 'step' on every resume (an H200 run); a torch-AdamW checkpoint left the float step megatron stores
for torch in the param groups, and TE's kernel, which takes an int, raised a TypeError at the first step.
"""
import json
import math
import shutil

import pytest

import train_scenarios as sc
from mlmclm.parallel.launch import spawn
from mlmclm.train import checkpoint as ckpt
from optimizer_scenarios import Run, run_one
from test_training_run import metrics, phase_loss

BF16 = {"precision": {"dtype": "bf16"}}
TE_STATE = ["exp_avg", "exp_avg_sq"]  # what TE keeps per parameter (no master weights: megatron holds them)


def bf16_config(run_dir, data, **overrides):
    return sc.config(run_dir, data, tp=1, **BF16, **overrides)


def resume_dir(source_run, iteration, target):
    """A run directory whose latest checkpoint is a copy of `source_run`'s `iteration`."""
    (target / "checkpoints").mkdir(parents=True)
    name = f"iter_{iteration:07d}"
    shutil.copytree(source_run / "checkpoints" / name, target / "checkpoints" / name)
    (target / "checkpoints" / ckpt.LATEST_FILE).write_text(str(iteration))
    return target


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data):
    """Six process groups, one run each (megatron start-up is most of each one's time)."""
    root = tmp_path_factory.mktemp("fused_adam")
    ref = root / "te_reference"
    cpt_source = str(ref / "checkpoints" / f"iter_{sc.SWITCH:07d}")
    plan = {  # name: (ranks, run directory, Run); in order: later runs start from earlier checkpoints
        "reference": (2, ref, Run(bf16_config(ref, data))),
        "torch": (2, root / "torch_adamw", Run(bf16_config(root / "torch_adamw", data), "torch", stop_after=3)),
        "exact": (2, root / "exact", Run(bf16_config(root / "exact", data))),
        # torch's DP=2 checkpoint resumed under TE on one rank: the float step, and TE's state resharded.
        "from_torch": (1, root / "torch_adamw", Run(bf16_config(root / "torch_adamw", data), stop_after=6)),
        "back_to_torch": (1, root / "back", Run(bf16_config(root / "back", data), "torch", stop_after=8)),
        "cpt": (1, root / "cpt", Run(bf16_config(root / "cpt", data, total_steps=3, schedule={"style": "constant"},
                                                 phases=[{"objective": {"kind": "mlm"}, "steps": 3}],
                                                 checkpoint={"init_from": cpt_source}))),
    }
    records = {}
    for name, (ranks, run_dir, run) in plan.items():
        if name == "exact":
            resume_dir(ref, 3, run_dir)
        if name == "back_to_torch":
            resume_dir(ref, 6, run_dir)
        spawn(run_one, ranks, run, root / f"{name}.json")
        records[name] = {**json.loads((root / f"{name}.json").read_text()), "dir": run_dir}
    return records


def test_the_te_optimizer_trains_keeping_its_step_in_the_groups(runs):
    reference = runs["reference"]
    assert reference["status"] == "completed", reference["error"]
    assert reference["at_end"] == {"optimizer": ["FusedAdamStandIn"], "group_steps": [repr(sc.TOTAL)],
                                   "param_state_names": TE_STATE}
    rows = metrics(reference["dir"])
    clm = [phase_loss(rows[s]) for s in range(1, sc.SWITCH + 1)]
    mlm = [phase_loss(rows[s]) for s in range(sc.SWITCH + 1, sc.TOTAL + 1)]
    assert clm[-1] < clm[0] - 0.3 and sum(mlm[-2:]) / 2 < sum(mlm[:2]) / 2 - 0.3
    # The same AdamW as torch's, up to the order of its float operations: the first 3 steps agree closely.
    ours, torch_rows = metrics(reference["dir"]), metrics(runs["torch"]["dir"])
    for step in (1, 2, 3):
        assert phase_loss(ours[step]) == pytest.approx(phase_loss(torch_rows[step]), abs=2e-2), step


def test_te_resume_from_before_the_switch_is_exact(runs):
    """The H200 bug: this resume raised KeyError: 'step' in TE's state_dict."""
    exact = runs["exact"]
    assert exact["status"] == "completed", exact["error"]
    assert exact["after_restore"]["group_steps"] == ["3"]  # an int, TE's kernel argument
    assert exact["after_restore"]["param_state_names"] == TE_STATE
    ours, ref = metrics(exact["dir"]), metrics(runs["reference"]["dir"])
    assert sorted(ours) == list(range(4, sc.TOTAL + 1))  # its directory held the checkpoint only
    for step in range(4, sc.TOTAL + 1):
        assert phase_loss(ours[step]) == phase_loss(ref[step]), step  # bit for bit
        assert ours[step]["train/grad_norm"] == ref[step]["train/grad_norm"], step


def test_random_and_numpy_streams_continue_across_a_resume(runs):
    """Each step draws from `random` and numpy's global generator: after the resume from step 3 the draws are the
    reference's draws of the same steps (the checkpoint restored both generators on the same layout)."""
    ref, exact = runs["reference"]["draws"], runs["exact"]["draws"]
    assert sorted(exact, key=int) == [str(s) for s in range(4, sc.TOTAL + 1)]
    assert all(exact[step] == ref[step] for step in exact), (exact, ref)
    rng_file = runs["exact"]["dir"] / "checkpoints" / "iter_0000003" / "rng"
    assert sorted(p.name for p in rng_file.iterdir()) == ["tp0_pp0_dp0.pt", "tp0_pp0_dp1.pt"]


def test_a_torch_adamw_checkpoint_resumes_under_te_with_its_step_cast_to_int(runs):
    """torch's AdamW leaves a float step (3.0) in the checkpoint's param groups, where TE's kernel takes an int, and
    no `bias_correction`, which TE's step reads (seen: TypeError, then KeyError: 'bias_correction'). The resume is
    also a reshard (DP=2 → one rank) of the Adam moments into TE's state."""
    assert runs["torch"]["status"] == "preempted" and runs["torch"]["steps"] == 3, runs["torch"]["error"]
    assert runs["torch"]["at_end"]["group_steps"] == []  # torch keeps it per parameter
    assert "step" in runs["torch"]["at_end"]["param_state_names"]
    resumed = runs["from_torch"]
    assert resumed["status"] == "preempted" and resumed["steps"] == 6, resumed["error"]
    assert resumed["after_restore"] == {"optimizer": ["FusedAdamStandIn"], "group_steps": ["3"],
                                        "param_state_names": TE_STATE}
    assert resumed["at_end"]["group_steps"] == ["6"]
    ours, ref = metrics(resumed["dir"]), metrics(runs["reference"]["dir"])
    for step in (4, 5, 6):  # another AdamW's first 3 steps, another layout: close, not bit for bit
        assert ours[step]["train/lr"] == ref[step]["train/lr"], step
        assert phase_loss(ours[step]) == pytest.approx(phase_loss(ref[step]), abs=5e-2), step
        assert ours[step]["train/grad_norm"] == pytest.approx(ref[step]["train/grad_norm"], rel=5e-2), step


def test_a_te_checkpoint_resumes_under_torch_adamw_on_one_rank(runs):
    back = runs["back_to_torch"]
    assert back["status"] == "preempted" and back["steps"] == 8, back["error"]
    assert back["after_restore"]["optimizer"] == ["AdamW"]
    assert "step" in back["after_restore"]["param_state_names"]  # torch's per-parameter step, from the group's
    ours, ref = metrics(back["dir"]), metrics(runs["reference"]["dir"])
    for step in (7, 8):  # bf16 forward on another layout, another AdamW: agreement to bf16 precision
        assert phase_loss(ours[step]) == pytest.approx(phase_loss(ref[step]), abs=2e-2), step
        assert ours[step]["train/grad_norm"] == pytest.approx(ref[step]["train/grad_norm"], rel=5e-2), step


def test_continued_pretraining_under_te_starts_from_the_loaded_weights(runs):
    cpt = runs["cpt"]
    assert cpt["status"] == "completed", cpt["error"]
    assert cpt["after_restore"]["group_steps"] == [] and cpt["after_restore"]["param_state_names"] == []
    assert cpt["at_end"]["group_steps"] == ["3"]
    rows, ref = metrics(cpt["dir"]), metrics(runs["reference"]["dir"])
    # The first MLM step on the CLM phase end's weights: the reference's first MLM loss, not a random model's.
    assert phase_loss(rows[1]) == pytest.approx(phase_loss(ref[sc.SWITCH + 1]), abs=0.3)
    assert phase_loss(rows[1]) < math.log(8192) - 0.5  # a random init starts at ~ln(vocab)
