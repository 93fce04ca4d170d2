"""The paper's pretraining grid as data, its plan, and one command that dry-runs it on Slurm or runs it on CPU."""
import json
from pathlib import Path

import fiddle as fdl
import pytest
from nemo_run.core.serialization.zlib_json import ZlibJSONSerializer

from recipes import grid, registry, sweep
from recipes.base import validate


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

    def checkpointed(name, step):
        (tmp_path / name / "checkpoints").mkdir(parents=True)
        (tmp_path / name / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(f"{step}\n")

    checkpointed("610m-clm-42k", 42_000)
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
    with pytest.raises(ValueError, match="matches no run"):
        sweep.select(everything, ["7b-*"])
    # container paths are checked through the executor's checkpoint_dir mount
    assert sweep.host_run_dir("/checkpoints/mlmclm/x", "/lustre/ckpt") == Path("/lustre/ckpt/mlmclm/x")
    assert sweep.host_run_dir("/checkpoints/mlmclm/x", None) is None


def test_slurm_dryrun_of_the_whole_paper_grid(nemo_home, tmp_path, capsys):
    rc = sweep.main(["paper", "--executor", "slurm", "--dryrun", "executor.account=acct",
                     f"executor.job_dir={tmp_path / 'jobs'}", f"executor.checkpoint_dir={tmp_path / 'ckpt'}",
                     "nodes=12"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "38 runs" in out and "GPU-hours at 40% MFU" in out and "610m-clm-10k-mlm40-42k" in out
    scripts = {p.name.removesuffix("_sbatch.sh"): p.read_text() for p in Path(nemo_home).rglob("*_sbatch.sh")}
    assert set(scripts) == {r.name for r in grid.paper_grid()}
    assert all("#SBATCH --nodes=12" in text.splitlines() for text in scripts.values())
    (serialised,) = Path(nemo_home).rglob("configs/610m-clm-dec42k-mlm40-64k_fn_or_script")
    partial = ZlibJSONSerializer().deserialize(serialised.read_text())
    cfg = fdl.build(partial.config)
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


def test_tiny_grid_runs_on_cpu_with_a_dependent_cpt_and_skips_finished_runs(nemo_home, tmp_path, tiny_data,
                                                                            capsys):
    root = tmp_path / "grid"
    args = ["tiny", "--run-root", str(root), "--data-path", tiny_data, "--only", "tiny-clm-4", "tiny-clm-dec*",
            "executor.gpus=false"]
    assert sweep.main(args) == 0, capsys.readouterr()
    clm, cpt = root / "tiny-clm-4", root / "tiny-clm-dec4-mlm40-6"
    assert (clm / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    assert (cpt / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    state = json.loads((cpt / "checkpoints" / "iter_0000002" / "run_config.json").read_text())
    assert state["checkpoint"]["init_from"] == str(clm)
    logs = "".join(p.read_text() for p in Path(nemo_home).rglob("*.log") if "tiny-clm-dec" in str(p))
    assert f"initialised weights from {clm / 'checkpoints' / 'iter_0000004'}" in logs
    capsys.readouterr()
    # the same command again: both finished, nothing is launched
    assert sweep.main(args) == 0
    out = capsys.readouterr().out
    assert "nothing to launch" in out and out.count("finished") >= 2
