"""Branches off the WSD stable phase (mlmclm.train.branch): a branch at step s reproduces its parent after s, the
tiny biphasic run built as a branch of the tiny CLM run equals the one-job biphasic run bit for bit, anything that
would change the steps before s is refused by name, and a parent run in segments (checkpoint.stop_at) is the same
run. All runs share one spawned process (each megatron start costs seconds)."""
import json
from pathlib import Path

import pytest

import train_scenarios as sc
from mlmclm.parallel.launch import spawn

BRANCH = sc.SWITCH  # the one-job biphasic run switches to MLM after step 4
TRACKED = ("train/clm/loss", "train/mlm/loss", "train/lr", "train/grad_norm")


def _rows(run_dir: Path) -> dict[int, dict]:
    """step → its loss (under the phase's objective), LR and gradient norm, as logged."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: {k: row[k] for k in TRACKED if k in row} for row in rows}


def _clm_only(run_dir, data, **checkpoint):
    return sc.config(run_dir, data, phases=[{"objective": {"kind": "clm"}, "steps": sc.TOTAL}],
                     checkpoint={"save_interval": 3, **checkpoint})


def _short_biphasic(run_dir, data):
    """A shorter run than the parent (8 steps, decay from step 6): its own length and decay after the branch."""
    return sc.config(run_dir, data, total_steps=8, schedule={"style": "wsd", "warmup_steps": 2, "decay_steps": 2},
                     phases=[{"objective": {"kind": "clm"}, "steps": BRANCH},
                             {"objective": {"kind": "mlm", "mask_ratio": 0.3}, "steps": 8 - BRANCH}])


def _branch(cfg, parent, step=BRANCH):
    return {**cfg, "checkpoint": {**cfg["checkpoint"], "branch_from": str(parent), "branch_step": step}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data):
    root = tmp_path_factory.mktemp("branch")
    parent = root / "parent_clm"
    plan = {
        # keep_last=1 would prune step 4's periodic checkpoint; keep_steps protects it for the children
        "parent": _clm_only(parent, data, keep_steps=[BRANCH], keep_last=1),
        "one_job_biphasic": sc.config(root / "one_job", data),
        "one_job_short": _short_biphasic(root / "one_job_short", data),
        "branch_same_plan": _branch(_clm_only(root / "b_same", data), parent),
        "branch_biphasic": _branch(sc.config(root / "b_biphasic", data), parent),
        "branch_short": _branch(_short_biphasic(root / "b_short", data), parent),
        "refused_seed": _branch({**sc.config(root / "r_seed", data), "seed": 7}, parent),
        "refused_batch": _branch({**sc.config(root / "r_batch", data), "global_batch_size": 4}, parent),
        "refused_warmup": _branch(sc.config(root / "r_warmup", data, schedule={"style": "wsd", "warmup_steps": 1,
                                                                             "decay_steps": 3}), parent),
        "refused_phases": _branch(sc.config(root / "r_phases", data, phases=[
            {"objective": {"kind": "clm"}, "steps": 3}, {"objective": {"kind": "mlm", "mask_ratio": 0.3},
                                                         "steps": sc.TOTAL - 3}]), parent),
        "refused_decay": _branch(sc.config(root / "r_decay", data, schedule={"style": "wsd", "warmup_steps": 2,
                                                                           "decay_steps": 7}), parent),
        "segment_1": _clm_only(root / "segmented", data, stop_at=BRANCH),
        "segment_1_again": _clm_only(root / "segmented", data, stop_at=BRANCH),
        "segment_2": _clm_only(root / "segmented", data),
    }
    report = root / "report.json"
    spawn(sc.run_each_reporting_errors, 1, list(plan.values()), str(report))
    results = dict(zip(plan, json.loads(report.read_text())))
    return root, plan, results


def test_a_branch_given_its_parents_plan_reproduces_the_parent_bit_for_bit(runs):
    root, plan, results = runs
    assert results["branch_same_plan"]["status"] == "completed", results["branch_same_plan"]
    parent, branch = _rows(root / "parent_clm"), _rows(root / "b_same")
    assert sorted(branch) == list(range(BRANCH + 1, sc.TOTAL + 1))  # it trained only the steps after the branch
    assert {s: parent[s] for s in branch} == branch


@pytest.mark.parametrize("one_job, branch, total", [("one_job", "b_biphasic", sc.TOTAL),
                                                     ("one_job_short", "b_short", 8)])
def test_the_biphasic_branch_equals_the_one_job_biphasic_run(runs, one_job, branch, total):
    root, plan, results = runs
    one_job, branch = _rows(root / one_job), _rows(root / branch)
    assert sorted(branch) == list(range(BRANCH + 1, total + 1))
    assert all(len(row) == 3 for row in branch.values()) and "train/mlm/loss" in branch[total]
    assert {s: one_job[s] for s in branch} == branch  # loss, LR and grad norm at every step, exactly


def test_a_branch_records_its_parent(runs):
    root, _, _ = runs
    state = json.loads((root / "b_biphasic" / "checkpoints" / "iter_0000010" / "train_state.json").read_text())
    assert state["branched_from"] == {"checkpoint": str(root / "parent_clm" / "checkpoints" / "iter_0000004"),
                                      "step": BRANCH}


def test_the_parent_keeps_its_branch_point_despite_pruning(runs):
    root, _, _ = runs
    kept = sorted(p.name for p in (root / "parent_clm" / "checkpoints").glob("iter_*"))
    assert "iter_0000004" in kept and "iter_0000003" not in kept


@pytest.mark.parametrize("name, message", [
    ("refused_seed", r"seed is 1234 in the parent but 7 here"),
    ("refused_batch", r"global_batch_size is 8 in the parent but 4 here"),
    ("refused_warmup", r"schedule\.warmup_steps is 2 in the parent but 1 here"),
    ("refused_phases", r"phases\.0: the phases before the branch step 4 differ"),
    ("refused_decay", r"schedule\.decay_steps: this config's learning rate depends on the run's length from step 3"),
])
def test_a_branch_that_would_change_the_steps_before_it_is_refused_by_name(runs, name, message):
    import re

    root, plan, results = runs
    assert results[name]["type"] == "BranchError", results[name]
    assert re.search(message, results[name]["message"]), results[name]["message"]
    assert not list((Path(plan[name]["run_dir"]) / "checkpoints").glob("iter_*"))


def test_a_run_in_segments_is_the_same_run(runs):
    root, _, results = runs
    assert (results["segment_1"]["status"], results["segment_1"]["steps"]) == ("segment_done", BRANCH)
    assert (results["segment_1_again"]["status"], results["segment_1_again"]["steps"]) == ("segment_done", BRANCH)
    assert (results["segment_2"]["status"], results["segment_2"]["steps"]) == ("completed", sc.TOTAL)
    assert _rows(root / "segmented") == _rows(root / "parent_clm")
