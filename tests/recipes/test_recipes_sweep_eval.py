"""`python -m recipes.sweep tiny --with-eval` on the local executor: every tiny run trained, then exported
(`convert_to_hf --verify`), then evaluated, one after the other, and one paper report over all of them at the end;
the same command again starts nothing and says so. The Slurm chain's dependencies: a dry run of the paper grid."""
import json
from pathlib import Path

import pytest

from recipes import sweep

# five torchrun launches (four runs, one a segment), four exports and evaluations, the report: ~5 min on 2 cores.
# One rank a run: the test is about the chain (segments, branch, dependencies, exports, evaluations, report); two
# ranks through NeMo-Run's local executor are the local-run and Ctrl-C tests' (tests/recipes/conftest.py).
pytestmark = pytest.mark.timeout(1500)

RUNS = ("tiny-clm-4", "tiny-mlm40-4", "tiny-clm-2-mlm40-4", "tiny-clm-dec4-mlm40-6")


def test_the_tiny_sweep_with_eval_trains_exports_evaluates_and_reports_once(nemo_home, tmp_path, tiny_data, capsys):
    root = tmp_path / "grid"
    args = ["tiny", "--run-root", str(root), "--data-path", tiny_data, "--with-eval", "--eval-seeds", "0",
            "--eval-max-steps", "2", "--eval-batch-size", "4", "executor.gpus=false", "processes=1"]
    assert sweep.main(args) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    hf, evals, report = (Path(f"{root}-{suffix}") for suffix in ("hf", "eval", "report"))
    _grid_trained_with_a_branch_and_a_dependent_cpt(root, nemo_home)
    for name in RUNS:
        final = (root / name / "checkpoints" / "latest_checkpointed_iteration.txt")
        steps = 2 if "dec" in name else 4
        assert final.read_text().strip() == str(steps), name
        # exported from its final checkpoint after it was written, then evaluated from that export
        export, summary = hf / name / "config.json", evals / name / "summary.json"
        assert f"# {name} — iteration {steps}" in (hf / name / "README.md").read_text()
        assert final.stat().st_mtime <= export.stat().st_mtime <= summary.stat().st_mtime, name
        models = {row["model"] for row in json.loads(summary.read_text())["tasks"]}
        assert models == {name} and len(list((evals / name / "runs" / name).glob("*/*.json"))) == 4
        assert f"export-{name}  ← after {name}" in out and f"eval-{name}  ← after export-{name}" in out
    # one report, after every evaluation, over every model
    table = (report / "main_table.md").read_text()
    assert all(f"| {name} |" in table for name in RUNS), table
    assert all((evals / name / "summary.json").stat().st_mtime <= (report / "report.md").stat().st_mtime
               for name in RUNS)
    assert f"report: {report}/report.md" in out
    # a line per job as it starts, the chain's 14 in order (locally NeMo-Run prints nothing of them)
    order = ["tiny-clm-4-until-2", "tiny-clm-4", "tiny-mlm40-4", "tiny-clm-2-mlm40-4", "tiny-clm-dec4-mlm40-6",
             *(f"{stage}-{name}" for name in RUNS for stage in ("export", "eval")), "report"]
    starts = [line.split("] ", 1)[1].split(" starting")[0] for line in out.splitlines()
              if line.startswith("sweep: ") and " starting (" in line]
    assert starts == order, out
    assert "sweep: report ended after " in out and "; 14 of 14 jobs ran in " in out, out
    experiments = sorted(p for p in Path(nemo_home).rglob("*") if p.is_dir())
    # the same command again: nothing to train, export, evaluate or report; no experiment is made
    assert sweep.main(args) == 0
    out = capsys.readouterr().out
    assert out.count("finished") >= 3, out
    assert out.rstrip().endswith(f"nothing to launch: every selected run has finished, been exported and evaluated, "
                                 f"and the report is written ({report}/report.md)"), out
    assert sorted(p for p in Path(nemo_home).rglob("*") if p.is_dir()) == experiments
    # ... and with a setting changed since they finished: refused naming it, not skipped as finished
    assert sweep.main([*args, "seed=99"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: ") and err.count("\n") == 1 and "seed is " in err and "but 99 here" in err, err
    assert str(root / "tiny-clm-4" / "checkpoints") in err and "nothing to launch" not in out, (out, err)
    assert sorted(p for p in Path(nemo_home).rglob("*") if p.is_dir()) == experiments  # nothing was launched


def _grid_trained_with_a_branch_and_a_dependent_cpt(root: Path, nemo_home) -> None:
    """The biphasic run is a branch of the CLM run at step 2: the CLM run ran as two jobs (a segment to step 2,
    then the rest) and the branch trained only steps 3-4, from the parent's full state; the CPT run started from
    the CLM run's final weights. (Was test_recipes_paper_grid.py's own tiny-grid run, which trained the same runs.)"""
    clm, cpt, branch = root / "tiny-clm-4", root / "tiny-clm-dec4-mlm40-6", root / "tiny-clm-2-mlm40-4"
    assert (clm / "checkpoints" / "iter_0000002" / "train_state.json").exists()
    state = json.loads((branch / "checkpoints" / "iter_0000004" / "train_state.json").read_text())
    assert state["branched_from"] == {"checkpoint": str(clm / "checkpoints" / "iter_0000002"), "step": 2}
    assert [json.loads(row)["step"] for row in (branch / "metrics.jsonl").read_text().splitlines()] == [3, 4]
    assert any(p.name == sweep.segment_name("tiny-clm-4", 2) for p in Path(nemo_home).rglob("*") if p.is_dir())
    state = json.loads((cpt / "checkpoints" / "iter_0000002" / "run_config.json").read_text())
    assert state["checkpoint"]["init_from"] == str(clm)
    logs = "".join(p.read_text() for p in Path(nemo_home).rglob("*.log") if "tiny-clm-dec" in str(p))
    assert f"initialised weights from {clm / 'checkpoints' / 'iter_0000004'}" in logs


def test_the_paper_chain_on_slurm_waits_for_each_run_and_sizes_each_evaluation(nemo_home, tmp_path, capsys):
    rc = sweep.main(["paper", "--only", "610m-clm-42k", "610m-clm-dec42k-mlm40-44k", "--with-eval",
                     "--eval-data-root", "/data/paper", "--eval-array-tasks", "4", "--executor", "slurm",
                     "executor.account=acct", f"executor.job_dir={tmp_path / 'jobs'}", "--dryrun"])
    assert rc == 0, capsys.readouterr()
    out = capsys.readouterr().out
    cpt = "610m-clm-dec42k-mlm40-44k"
    for line in ("export-610m-clm-42k  ← after 610m-clm-42k", f"eval-{cpt}  ← after export-{cpt}",
                 f"report  ← after eval-610m-clm-42k, eval-{cpt}"):
        assert line in out.splitlines(), out
    (script,) = Path(nemo_home).rglob(f"eval-{cpt}_sbatch.sh")
    text = script.read_text()
    assert "#SBATCH --array=0-3" in text and "#SBATCH --gpus-per-node=8" in text
    assert (f"tools/evaluate.py grid --model {cpt}=/checkpoints/mlmclm-hf/{cpt} --data-root /data/paper "
            f"--output /checkpoints/mlmclm-eval/{cpt}") in text
    (script,) = Path(nemo_home).rglob("export-610m-clm-42k_sbatch.sh")
    text = script.read_text()
    assert "--array" not in text and "--gpus-per-node" not in text and "scripts/export-610m-clm-42k.sh" in text
    (inline,) = Path(nemo_home).rglob("scripts/export-610m-clm-42k.sh")
    assert inline.read_text().splitlines()[-1] == ("exec python /opt/mlmclm/tools/convert_to_hf.py "
                                                   "/checkpoints/mlmclm/610m-clm-42k /checkpoints/mlmclm-hf/610m-clm-42k "
                                                   "--verify --force")
    assert inline.read_text().splitlines()[-2].startswith(
        "if [ /checkpoints/mlmclm-hf/610m-clm-42k/config.json -nt "
        "/checkpoints/mlmclm/610m-clm-42k/checkpoints/latest_checkpointed_iteration.txt ]; then")
