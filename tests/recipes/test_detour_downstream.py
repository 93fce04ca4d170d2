"""The detour family's downstream step (issue 57 parts 3-4), the cheap parts: the report's downstream table from
the evaluation's run records (per task the LR chosen on validation, mean ± 95 % CI over the fine-tuning seeds; the
mean over tasks per seed, then over seeds), and the family on Slurm as a dry run — import, then detour and control
in parallel, their exports, the evaluation's job array, the report, each job `afterok` the ones it reads. The twin
end to end with an evaluation: tests/recipes/test_detour_recipe.py."""
import json
from dataclasses import asdict
from pathlib import Path

import pytest
from scipy import stats

from mlmclm.eval.finetune.protocol import RunRecord, run_path, write_json_atomic

RECORD = dict(family="classification", main_metric="accuracy", diverged=False, steps=100, train_loss_first=1.0,
              train_loss_last=0.5, fingerprint="f")


def _record(out: Path, model: str, task: str, lr: float, seed: int, validation: float, test: float) -> None:
    record = RunRecord(model=model, task=task, learning_rate=lr, seed=seed, validation={"accuracy": validation},
                       test={"accuracy": test}, **RECORD)
    write_json_atomic(run_path(out, model, task, lr, seed), asdict(record))


def _ci(values) -> float:
    n = len(values)
    mean = sum(values) / n
    std = (sum((v - mean) ** 2 for v in values) / (n - 1)) ** 0.5
    return stats.t.ppf(0.975, n - 1) * std / n ** 0.5


def test_the_report_puts_the_held_out_loss_beside_each_tasks_mean_and_ci_over_seeds(tmp_path):
    from recipes.detour_report import write_report

    root = tmp_path / "detour"
    root.mkdir()
    (root / "step0_held_out.json").write_text(json.dumps({"val/mlm/loss": 7.5}))
    tests = {("detour", "a"): [0.60, 0.70, 0.80], ("detour", "b"): [0.50, 0.50, 0.80],
             ("control", "a"): [0.55, 0.65, 0.60], ("control", "b"): [0.40, 0.45, 0.50]}
    for (model, task), scores in tests.items():
        for seed, score in enumerate(scores):
            _record(root / "eval", model, task, 1e-4, seed, validation=0.9, test=score)
            # a worse LR on validation: never reported, whatever its test score
            _record(root / "eval", model, task, 1e-3, seed, validation=0.1, test=0.99)
    text = write_report(root, 4, 6)
    row = next(line for line in text.splitlines() if line.startswith("| detour | "))
    a, b = tests[("detour", "a")], tests[("detour", "b")]
    means = [(x + y) / 2 for x, y in zip(a, b)]  # per seed over the tasks, then over the seeds
    assert row == (f"| detour | — | {100 * sum(a) / 3:.1f} ± {100 * _ci(a):.1f} (3 seeds) | "
                   f"{100 * sum(b) / 3:.1f} ± {100 * _ci(b):.1f} (3 seeds) | "
                   f"{100 * sum(means) / 3:.1f} ± {100 * _ci(means):.1f} (3 seeds) |"), text
    assert "| run | held-out MLM loss (end) | a | b | mean over tasks |" in text
    saved = json.loads((root / "report.json").read_text())
    cell = saved["downstream"]["runs"]["control"]["b"]
    assert cell["mean"] == pytest.approx(0.45) and cell["ci95"] == pytest.approx(_ci([0.40, 0.45, 0.50]))
    assert (cell["seeds"], cell["lr"]) == (3, 1e-4)
    assert (root / "report.md").read_text() == text


def test_one_seed_has_no_interval_and_no_evaluation_no_table(tmp_path):
    from recipes.detour_report import write_report

    root = tmp_path / "detour"
    root.mkdir()
    assert "Downstream" not in write_report(root, 4, 6)  # not evaluated (yet): the loss table alone
    _record(root / "eval", "detour", "a", 1e-4, 0, validation=0.9, test=0.5)
    text = write_report(root, 4, 6)
    assert "| detour | — | 50.0 (1 seed: no interval) | 50.0 (1 seed: no interval) |" in text
    assert "| control | — | — | — |" in text
    assert json.loads((root / "report.json").read_text())["downstream"]["runs"]["detour"]["a"]["ci95"] is None


def _tiny_source(host_checkpoints: Path) -> Path:
    from recipes import detour

    return detour.make_tiny_modernbert(host_checkpoints / "models" / "tiny")


def test_the_family_on_slurm_is_one_dependency_chain(nemo_home, tmp_path, monkeypatch, capsys):
    from recipes import detour_run

    host = tmp_path / "lustre_checkpoints"  # what the nodes see as /checkpoints
    _tiny_source(host)
    monkeypatch.setenv("MLMCLM_CHECKPOINT_DIR", str(host))
    experiments = []
    launch = detour_run.launch_family
    monkeypatch.setattr(detour_run, "launch_family", lambda *a, **k: experiments.append(launch(*a, **k)))
    rc = detour_run.main(["tiny", "--root", "/checkpoints/detour", "--source", "/checkpoints/models/tiny",
                          "--data-path", "/data/domain", "steps=4", "decay_share=0.5", "--tasks", "/data/tasks.json",
                          "--seeds", "0", "1", "2", "--array-tasks", "2", "--workers", "4", "--executor", "slurm",
                          "executor.account=acct", f"executor.job_dir={tmp_path / 'jobs'}", "--dryrun"])
    assert rc == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert ("jobs and their dependencies:\nimport\ndetour  ← after import\ncontrol  ← after import\n"
            "export-detour  ← after detour\nexport-control  ← after control\n"
            "eval  ← after export-detour, export-control\nreport  ← after eval\n") in out, out
    (exp,) = experiments
    assert {job.id: job.dependencies for job in exp.jobs} == {
        "import": [], "detour": ["import"], "control": ["import"], "export-detour": ["detour"],
        "export-control": ["control"], "eval": ["export-detour", "export-control"], "report": ["eval"]}
    scripts = {p.name.removesuffix("_sbatch.sh"): p.read_text() for p in Path(nemo_home).rglob("*_sbatch.sh")}
    assert set(scripts) == {"import", "detour", "control", "export-detour", "export-control", "eval", "report"}
    # the runs: the training's torchrun on the twin's 2 ranks; the import on as many GPUs, one process (it spawns)
    assert "--nproc-per-node 2" in scripts["detour"] and "#SBATCH --gpus-per-node=2" in scripts["import"]
    assert "torchrun" not in scripts["import"]
    for name in ("export-detour", "export-control", "report"):  # CPU jobs
        assert "--gpus-per-node" not in scripts[name] and "--array" not in scripts[name], name
    # the evaluation: the grid over both exports, one output folder, a job array of 2 tasks × 4 GPUs
    assert "#SBATCH --array=0-1" in scripts["eval"] and "#SBATCH --gpus-per-node=4" in scripts["eval"]
    assert ("tools/evaluate.py grid --model detour=/checkpoints/detour/export/detour --model "
            "control=/checkpoints/detour/export/control --tasks /data/tasks.json --seeds 0 1 2 --output "
            "/checkpoints/detour/eval --workers 4 --device auto") in scripts["eval"]
    tasks = {job.id: job.task for job in exp.jobs}
    assert tasks["export-detour"].__fn_or_cls__.__name__ == "export_run"
    assert (tasks["export-detour"].run_dir, tasks["export-detour"].target) == ("/checkpoints/detour/detour",
                                                                              "/checkpoints/detour/export/detour")
    assert tasks["import"].__fn_or_cls__.__name__ == "import_and_measure"
    assert tasks["import"].source == "/checkpoints/models/tiny"
    assert (tasks["report"].__fn_or_cls__.__name__, tasks["report"].root) == ("report_task", "/checkpoints/detour")
    assert not (host / "detour").exists()  # a dry run writes nothing where the jobs would


@pytest.mark.parametrize("argv, message", [
    pytest.param(["--executor", "slurm", "--dryrun"], "on Slurm the family needs --source and --data-path",
                 id="slurm-without-source"),
    pytest.param(["--source", "/checkpoints/models/none", "--data-path", "/data/d", "--executor", "slurm"],
                 "--source /checkpoints/models/none: no config.json where this machine sees it", id="unseen-source"),
    pytest.param(["--source", "/checkpoints/models/tiny", "--data-path", "/elsewhere/d", "--executor", "slurm",
                  "--dryrun"], "data_path /elsewhere/d is under no container mount", id="unreachable-data"),
    pytest.param(["--dryrun"], "--dryrun, --detach and executor.KEY=VALUE are for --executor slurm", id="local-dry"),
    pytest.param(["--seeds", "0", "1"], "--lrs/--seeds/--max-steps/--batch-size/--task tune the evaluation",
                 id="seeds-without-tasks"),
    pytest.param(["--smoke", "--no-export"], "the evaluation fine-tunes the exports", id="eval-without-export"),
    pytest.param(["--smoke", "--array-tasks", "2"], "--array-tasks is the Slurm job array's size", id="array-local"),
])
def test_bad_family_input_is_one_line_and_nothing_made(argv, message, nemo_home, tmp_path, monkeypatch, capsys):
    from recipes.detour_run import main

    host = tmp_path / "lustre_checkpoints"
    source = _tiny_source(host)
    monkeypatch.setenv("MLMCLM_CHECKPOINT_DIR", str(host))
    capsys.readouterr()  # the model's writing
    if "--executor" in argv:  # the jobs' paths, and an account
        args = ["--root", "/checkpoints/detour", *argv, "executor.account=acct"]
    else:
        args = ["--root", str(tmp_path / "root"), "--source", str(source), "--data-path", str(tmp_path / "d"), *argv]
    assert main(["tiny", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "root").exists() and not (host / "detour").exists()
    assert not any(Path(nemo_home).rglob("*_sbatch.sh"))
