"""The paper's pretraining grid as data, its plan, and one command that dry-runs it on Slurm or runs it on CPU."""
from pathlib import Path

import pytest

from mlmclm.model.memory import GIB, H100_80GB_BYTES
from recipes import grid, registry, sweep
from mlmclm.train.config import TrainConfig
from recipes.base import validate
from recipes.rank import task_of_script


def _cfg(entry):
    return validate(registry.get(entry.recipe).build(**entry.params, **(
        {"init_from": f"/checkpoints/mlmclm/{entry.after}"} if entry.after else {})))


def test_paper_grid_is_the_papers_38_runs():
    runs = grid.get_grid("paper")
    names = {r.name for r in runs}
    assert len(runs) == 38
    for size in ("210m", "610m", "1b"):
        assert {f"{size}-mlm{m}-42k" for m in (20, 30, 40, 50)} | {f"{size}-clm-42k"} <= names
    assert {"610m-mlm40-12k", "610m-clm-12k", "610m-mlm40-22k", "610m-clm-22k"} <= names
    biphasic = {"610m-clm-3k-mlm40-12k", "610m-clm-6k-mlm40-12k", "610m-clm-9k-mlm40-12k",
                "610m-clm-5k-mlm40-22k", "610m-clm-11k-mlm40-22k", "610m-clm-17k-mlm40-22k",
                "610m-clm-10k-mlm40-42k", "610m-clm-21k-mlm40-42k", "610m-clm-32k-mlm40-42k"}
    ablation = {f"610m-clm-40k-mlm{m}-42k" for m in (20, 30, 40, 50)}
    cpt = {f"610m-{parent}-dec42k-mlm40-{total}k" for parent in ("clm", "mlm40") for total in (44, 54, 64)}
    assert biphasic | ablation | cpt <= names
    # biphasic and continued pretraining only at 610m, as in the paper
    assert all(r.name.startswith("610m-") for r in runs if r.recipe.startswith(("clm_mlm", "cpt")))
    order = [r.name for r in runs]
    for r in runs:
        if r.after:  # a CPT run continues a decayed parent of the grid, listed before it
            assert r.recipe == "cpt_610m" and order.index(r.after) < order.index(r.name)
            assert r.after in ("610m-clm-42k", "610m-mlm40-42k")


@pytest.mark.parametrize("entry", grid.paper_grid(), ids=lambda e: e.name)
def test_each_grid_run_builds_with_its_released_name_and_settings(entry):
    cfg = _cfg(entry)
    assert Path(cfg.run_dir).name == entry.name  # the builder's own name is the released model's name
    assert cfg.model.max_position_embeddings == 2048
    steps = cfg.phase_steps()
    assert all(s % 1000 == 0 for s in steps)  # whole thousands, as the released names say
    if entry.recipe.startswith("clm_mlm"):
        assert [p.objective.kind for p in cfg.phases] == ["clm", "mlm"]
        assert f"-clm-{steps[0] // 1000}k-mlm{round(cfg.phases[1].objective.mask_ratio * 100)}-" in entry.name
        assert cfg.schedule.decay_steps <= steps[-1]  # the 2k decay lies inside the MLM phase (40k+2k too)
    if entry.after:
        assert cfg.checkpoint.init_from == f"/checkpoints/mlmclm/{entry.after}"


def test_plan_states_costs_and_parents(tmp_path):
    planned = sweep.build_plan("paper", run_root=str(tmp_path))
    by_name = {p.entry.name: p for p in planned}
    assert all(p.state == "new" and p.gpu_hours > 0 for p in planned)
    # one step = 2304 random-length samples of 1030 tokens on average = 2 373 120 tokens, ≈ 99.7B per 42k run (the
    # paper's budget); CLM costs less than MLM (half the attention work)
    assert by_name["610m-mlm40-42k"].tokens == 42_000 * 2_373_120 == pytest.approx(99.7e9, rel=1e-3)
    rows = {p.entry.name: p for p in sweep.build_plan("paper", run_root=str(tmp_path), params={"fixed_rows": True})}
    assert rows["610m-mlm40-42k"].tokens == 42_000 * 2304 * 2048   # fixed 2048-token rows stay available
    assert rows["610m-mlm40-42k"].gpu_hours > 2 * by_name["610m-mlm40-42k"].gpu_hours   # twice the tokens, longer
    assert by_name["610m-clm-42k"].gpu_hours < by_name["610m-mlm40-42k"].gpu_hours
    assert by_name["1b-mlm40-42k"].gpu_hours > by_name["610m-mlm40-42k"].gpu_hours

    def checkpointed(name, step, kept=()):
        (tmp_path / name / "checkpoints").mkdir(parents=True)
        (tmp_path / name / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(f"{step}\n")
        for kept_step in kept:  # the checkpoints its branches start from
            (tmp_path / name / "checkpoints" / f"iter_{kept_step:07d}").mkdir()
            (tmp_path / name / "checkpoints" / f"iter_{kept_step:07d}" / "train_state.json").write_text("{}")

    branch_steps = sweep.branch_points(planned)["610m-clm-42k"]
    checkpointed("610m-clm-42k", 42_000, kept=branch_steps)
    checkpointed("610m-mlm40-42k", 30_000)
    planned = {p.entry.name: p for p in sweep.build_plan("paper", run_root=str(tmp_path))}
    assert planned["610m-clm-42k"].state == "finished"
    assert planned["610m-mlm40-42k"].state == "partial 30000/42000"
    everything = list(planned.values())
    launching = [p.entry.name for p in sweep.to_launch(everything)]
    assert "610m-clm-42k" not in launching and "610m-mlm40-42k" in launching and len(launching) == 37
    # CPT from the finished CLM parent may go alone; from the unfinished MLM parent it may not
    alone = sweep.select(everything, ["610m-clm-dec*"])
    assert len(sweep.to_launch(alone, everything)) == 3
    with pytest.raises(ValueError, match="continues 610m-mlm40-42k, which has not finished and is not selected"):
        sweep.to_launch(sweep.select(everything, ["610m-mlm40-dec*"]), everything)
    # a branch may go alone once its parent's checkpoint at the branch step is written, not before
    assert len(sweep.to_launch(sweep.select(everything, ["610m-clm-32k-mlm40-42k"]), everything)) == 1
    (tmp_path / "610m-clm-42k" / "checkpoints" / "iter_0040000" / "train_state.json").unlink()
    with pytest.raises(ValueError, match="610m-clm-40k-mlm20-42k branches from 610m-clm-42k at step 40000, whose "
                                         "checkpoint is not written"):
        sweep.to_launch(sweep.select(everything, ["610m-clm-40k-mlm20-42k"]), everything)
    with pytest.raises(ValueError, match="matches no run"):
        sweep.select(everything, ["7b-*"])
    with pytest.raises(ValueError, match="--only 610m-clm-42 7b-x: matches no run"):  # a typo beside real names
        sweep.select(everything, ["610m-clm-42k", "610m-clm-42", "7b-x"])
    # container paths are checked through the executor's checkpoint_dir mount
    assert sweep.host_run_dir("/checkpoints/mlmclm/x", "/lustre/ckpt") == Path("/lustre/ckpt/mlmclm/x")
    assert sweep.host_run_dir("/checkpoints/mlmclm/x", None) is None


def test_plan_prices_the_grid_with_and_without_branches(tmp_path):
    planned = {p.entry.name: p for p in sweep.build_plan("paper", run_root=str(tmp_path))}
    # the 17 branches of the two 610m 42k runs skip 334k steps their parents train anyway (274k of biphasic CLM,
    # 60k of the 12k/22k pure runs' stable phases)
    branches = [p for p in planned.values() if p.entry.branch_of]
    assert len(branches) == 17 and sum(p.entry.branch_step for p in branches) == 334_000
    biphasic = planned["610m-clm-32k-mlm40-42k"]
    assert biphasic.own_gpu_hours == pytest.approx(planned["610m-mlm40-42k"].gpu_hours * 10 / 42, rel=1e-9)
    assert all(p.own_gpu_hours == p.gpu_hours for p in planned.values() if not p.entry.branch_of)
    table = sweep.plan_table(list(planned.values()), sweep.DEFAULT_MFU, sweep.DEFAULT_PEAK)
    with_b = sum(p.own_gpu_hours for p in planned.values())
    without = sum(p.gpu_hours for p in planned.values())
    assert f"{with_b:,.0f} GPU-hours" in table and f"{without:,.0f} without" in table and with_b < 0.8 * without
    # the parent keeps every branch point; each branch is the parent's run up to its step (checked when planned)
    keep = planned["610m-clm-42k"].partial.config.checkpoint.keep_steps
    assert keep == [3000, 5000, 6000, 9000, 10000, 11000, 17000, 20000, 21000, 32000, 40000]
    assert planned["610m-mlm40-42k"].partial.config.checkpoint.keep_steps == [10000, 20000]
    child = validate(biphasic.partial).checkpoint
    assert (child.branch_from, child.branch_step) == (str(tmp_path / "610m-clm-42k"), 32_000)
    # The memory plan: every run's estimated peak per rank at the mean and the worst micro-batch (12 × 2048 tokens
    # of random-length samples), the worst fitting an 80 GB H100; the table shows both and names the largest.
    clm_1b = planned["1b-clm-42k"].memory
    assert clm_1b.layout == "tp1 pp1 dp192" and (clm_1b.mean.tokens, clm_1b.worst.tokens) == (12_360, 24_576)
    assert all(p.memory.mean.total < p.memory.worst.total <= H100_80GB_BYTES for p in planned.values())
    assert f"{clm_1b.mean.total / GIB:.1f}/{clm_1b.worst.total / GIB:.1f}" in table
    assert "the largest is 1b-clm-42k: " + clm_1b.worst.summary() in table


def test_slurm_dryrun_of_the_whole_paper_grid(nemo_home, tmp_path, capsys):
    rc = sweep.main(["paper", "--executor", "slurm", "--dryrun", "executor.account=acct",
                     f"executor.job_dir={tmp_path / 'jobs'}", f"executor.checkpoint_dir={tmp_path / 'ckpt'}",
                     "nodes=12"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "38 runs" in out and "GPU-hours at 40% MFU" in out and "610m-clm-10k-mlm40-42k" in out
    scripts = {p.name.removesuffix("_sbatch.sh"): p.read_text() for p in Path(nemo_home).rglob("*_sbatch.sh")}
    segments = {sweep.segment_name("610m-clm-42k", k * 1000) for k in (3, 5, 6, 9, 10, 11, 17, 20, 21, 32, 40)} | \
        {sweep.segment_name("610m-mlm40-42k", k * 1000) for k in (10, 20)}
    assert set(scripts) == {r.name for r in grid.paper_grid()} | segments
    # the dependency graph printed: each branch after the segment that writes its checkpoint
    assert "610m-clm-32k-mlm40-42k  ← after 610m-clm-42k-until-32000" in out
    assert "610m-clm-42k-until-40000  ← after 610m-clm-42k-until-32000" in out
    assert "610m-clm-42k  ← after 610m-clm-42k-until-40000" in out
    assert "610m-clm-dec42k-mlm40-44k  ← after 610m-clm-42k\n" in out
    assert all("#SBATCH --nodes=12" in text.splitlines() for text in scripts.values())
    (script,) = Path(nemo_home).rglob("scripts/610m-clm-dec42k-mlm40-64k.sh")
    cfg = TrainConfig.from_dict(task_of_script(script.read_text())[0])
    assert cfg.checkpoint.init_from == "/checkpoints/mlmclm/610m-clm-42k" and cfg.total_steps == 22_000
    assert cfg.model.max_position_embeddings == 2048


def test_slurm_cpt_jobs_depend_on_their_decayed_parent(nemo_home, tmp_path):
    planned = sweep.select(sweep.build_plan("paper"), ["610m-clm-42k", "610m-mlm40-42k", "610m-*-dec42k-*"])
    exp = sweep.launch_plan(sweep.to_launch(planned), "slurm", {"account": "acct", "job_dir": str(tmp_path)},
                            dryrun=True)
    depends = {job.id: job.dependencies for job in exp.jobs}
    assert depends["610m-clm-42k"] == [] and depends["610m-mlm40-42k"] == []
    for total in (44, 54, 64):
        assert depends[f"610m-clm-dec42k-mlm40-{total}k"] == ["610m-clm-42k"]
        assert depends[f"610m-mlm40-dec42k-mlm40-{total}k"] == ["610m-mlm40-42k"]


def test_slurm_branches_depend_on_the_segment_that_writes_their_checkpoint(nemo_home, tmp_path):
    planned = sweep.select(sweep.build_plan("paper"), ["610m-clm-42k", "610m-clm-*-mlm40-12k", "610m-clm-12k"])
    exp = sweep.launch_plan(sweep.to_launch(planned), "slurm", {"account": "acct", "job_dir": str(tmp_path)},
                            dryrun=True)
    depends = {job.id: job.dependencies for job in exp.jobs}
    chain = [sweep.segment_name("610m-clm-42k", s) for s in (3000, 6000, 9000, 10000)] + ["610m-clm-42k"]
    assert depends[chain[0]] == [] and all(depends[b] == [a] for a, b in zip(chain, chain[1:]))
    for clm_k in (3, 6, 9):
        assert depends[f"610m-clm-{clm_k}k-mlm40-12k"] == [sweep.segment_name("610m-clm-42k", clm_k * 1000)]
    assert depends["610m-clm-12k"] == [sweep.segment_name("610m-clm-42k", 10_000)]
    stops = {job.id: task_of_script(job.task.inline)[0]["checkpoint"]["stop_at"] for job in exp.jobs}
    assert stops[chain[1]] == 6000 and stops["610m-clm-42k"] is None


def test_overrides_written_after_only_patterns_are_overrides_not_patterns(tmp_path, capsys):
    """`--only` takes every following word: `--only 610m-* nodes=12` must still set nodes (recipes/README.md's own
    example), and an override no recipe takes is refused, not matched as a run name and dropped."""
    root = ["--run-root", str(tmp_path)]
    assert sweep.main(["paper", "--plan", *root, "--only", "610m-clm-42k", "bogus=1"]) == 2
    assert "parameter(s) ['bogus'] are taken by no recipe" in capsys.readouterr().err
    assert sweep.main(["paper", "--plan", *root, "--only", "610m-clm-42k", "nodes=12"]) == 0
    assert "dp96" in capsys.readouterr().out   # 12 nodes x 8 GPUs, pure data parallel
    with pytest.raises(SystemExit):
        sweep.main(["paper", "--plan", *root, "--only", "nodes=12"])
    assert "--only needs at least one run name or pattern" in capsys.readouterr().err
