"""The mini-replication: its grid (the paper's design per pretraining seed), and the one command end to end at a
tiny scale — one seed, one CLM→MLM split, a few steps: six training jobs, the fewest that hold every kind of run —
through the sweep, the branch, the HF export, fill-mask, the smoke fine-tuning and the report over pretraining seeds.
Means and CIs over several seeds are checked on synthetic folders of the same format (tests/eval/test_seed_report.py);
a second seed here would double the test's time. One rank a run (`--processes 1`): the test is about the chain;
two ranks through NeMo-Run are the local-run and Ctrl-C tests' (tests/recipes/conftest.py)."""
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recipes import grid, mini, sweep
from recipes.progress import checkpointed_step

ROOT = Path(__file__).resolve().parents[2]


def test_mini_grid_is_the_papers_design_per_seed():
    runs = {r.name: r for r in grid.get_grid("mini")}
    assert len(runs) == 7 * len(grid.MINI_SEEDS)
    for seed in grid.MINI_SEEDS:
        clm, mlm = runs[f"mini-clm-400-s{seed}"], runs[f"mini-mlm40-400-s{seed}"]
        assert (clm.recipe, mlm.recipe) == ("tiny_clm", "tiny_mlm") and clm.params["seed"] == seed
        branches = [r for r in runs.values() if r.branch_of == clm.name]
        assert sorted(r.branch_step for r in branches) == [100, 200, 300]  # 25 / 50 / 75 % of the budget
        assert all(r.params["seed"] == seed and r.params["steps"] == 400 for r in branches)
        cpt = {r.after: r for r in runs.values() if r.after}
        assert cpt[clm.name].name == f"mini-clm-dec400-mlm40-100-s{seed}"
        assert cpt[mlm.name].name == f"mini-mlm40-dec400-mlm40-100-s{seed}"
        assert cpt[clm.name].params["steps"] == 100 and cpt[clm.name].params["seed"] == seed


def test_mini_plan_passes_the_branch_checks_and_refuses_a_switch_in_the_decay(tmp_path):
    planned = sweep.build_plan("mini", run_root=str(tmp_path), grid_options={"seeds": (1, 2)})
    assert len(planned) == 14 and all(p.state == "new" for p in planned)
    assert sweep.branch_points(planned)["mini-clm-400-s2"] == [100, 200, 300]
    with pytest.raises(ValueError, match="outside the CLM run's stable phase"):
        grid.get_grid("mini", splits=(0.9,))  # 360 of 400: inside the decay (the last 80 steps)
    with pytest.raises(ValueError, match="distinct"):
        grid.get_grid("mini", seeds=(1, 1))


def test_an_out_folder_with_other_files_is_refused(tmp_path, capsys):
    out = tmp_path / "docs"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    assert mini.main(["--out", str(out), "--work", str(tmp_path / "work"), "--plan"]) == 2
    assert "--force" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.md"] and not (tmp_path / "work").exists()


def test_the_command_end_to_end_at_a_tiny_scale(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    command = ["-m", "recipes", "grid", "mini", "--seeds", "3", "--steps", "8", "--cpt-steps", "4",
               "--splits", "0.5", "--smoke-steps", "2", "--passages", "4", "--processes", "1", "--work", str(work),
               "--out", str(out)]
    started = time.time()
    proc = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=570)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wall = time.time() - started
    runs = work / "runs"
    clm, branch = runs / "mini-clm-8-s3", runs / "mini-clm-4-mlm40-8-s3"
    trained = {clm: 8, runs / "mini-mlm40-8-s3": 8, branch: 8, runs / "mini-clm-dec8-mlm40-4-s3": 4,
               runs / "mini-mlm40-dec8-mlm40-4-s3": 4}
    for run, steps in trained.items():
        assert checkpointed_step(run) == steps, run
        state = json.loads((run / "checkpoints" / f"iter_{steps:07d}" / "train_state.json").read_text())
        assert state["layout"] == {"dp": 1, "pp": 1, "tp": 1}, run  # --processes 1
    # the branch resumed from its parent's kept step-4 checkpoint and trained steps 5..8 only, all MLM
    assert (clm / "checkpoints" / "iter_0000004" / "train_state.json").exists()
    rows = [json.loads(line) for line in (branch / "metrics.jsonl").read_text().splitlines()]
    assert min(r["step"] for r in rows) == 5 and {r["phase"] for r in rows} == {"mlm"}
    labels = [run.name for run in trained] + ["random-init"]
    for label in labels:
        assert (work / "hf" / label / "config.json").exists(), label
        for task in ("smoke_named_character", "smoke_speaker_names"):
            assert list((work / "eval" / "runs" / label / task).glob("lr*_seed0.json")), (label, task)
    measured = {r["label"]: r for r in json.loads((work / "eval" / "pretraining.json").read_text())["runs"]}
    assert [p[0] for p in measured[branch.name]["validation"]] == list(range(1, 9))  # 1..4 are the parent's
    assert measured[branch.name]["validation"][:4] == measured[clm.name]["validation"][:4]
    cpt = measured["mini-clm-dec8-mlm40-4-s3"]
    assert cpt["validation"][0] == [0] + measured[clm.name]["validation"][-1][1:]  # starts where its parent ended
    assert cpt["parent"] == {"label": clm.name, "objective": "CLM"} and cpt["objective"] == "CPT"
    assert measured[branch.name]["objective"] == "biphasic" and measured[branch.name]["clm_steps"] == 4
    table = (out / "seeds_table.md").read_text()
    for base in ("mini-clm-8", "mini-mlm40-8", "mini-clm-4-mlm40-8", "mini-clm-dec8-mlm40-4",
                 "mini-mlm40-dec8-mlm40-4"):
        assert f"| {base} | 1 |" in table, base  # grouped by the -s3 suffix
    header = (out / "seeds_table.csv").read_text().splitlines()[0]
    assert all(f"{c}_ci95" in header for c in ("val CLM", "val MLM", "fill-mask top-1", "QA", "TC"))
    for name in ("biphasic_seeds.png", "cpt_curves.png", "validation_curves.png", "report.md", "main_table.md"):
        assert (out / name).stat().st_size > 0, name
    facts = json.loads((out / "run.json").read_text())
    assert facts["command"] == "python -m recipes grid mini " + " ".join(command[4:]) and facts["trained_now"] == 5
    assert 0 < facts["wall_time_s"] <= wall
    assert "wall time" in (out / "README.md").read_text()


def test_the_mini_grid_can_add_a_mask_schedule_branch_per_seed(tmp_path, capsys):
    planned = sweep.build_plan("mini", run_root=str(tmp_path), grid_options={"seeds": (1, 2),
                                                                            "mask_schedule": (0.4, 0.15)})
    extra = [p for p in planned if "to15" in p.entry.name]
    assert [p.entry.name for p in extra] == ["mini-clm-200-mlm40to15-400-s1", "mini-clm-200-mlm40to15-400-s2"]
    from recipes.base import validate
    cfg = validate(extra[0].partial)
    mlm = cfg.phases[1].objective
    assert (mlm.mask_ratio, mlm.mask_schedule, mlm.mask_ratio_end) == (0.4, "linear", 0.15)
    assert (extra[0].entry.branch_of, extra[0].entry.branch_step) == ("mini-clm-400-s1", 200)
    assert mini.main(["--plan", "--seeds", "1", "--mask-schedule", "0.4", "0.15", "--work", str(tmp_path / "w"),
                      "--out", str(tmp_path / "o")]) == 0
    assert "mini-clm-200-mlm40to15-400-s1" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        mini.main(["--plan", "--mask-schedule", "0.4", "1.5", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")])
    assert refused.value.code == 2 and "--mask-schedule rates must be strictly between 0 and 1" in capsys.readouterr().err



def test_ranks_per_run_below_one_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        mini.main(["--plan", "--processes", "0", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o")])
    assert refused.value.code == 2 and "--processes must be >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "w").exists() and not (tmp_path / "o").exists()
