import json
import subprocess
import sys

from eval_fixtures import make_task_folder


def run_cli(*args):
    return subprocess.run([sys.executable, "tools/evaluate.py", *map(str, args)], capture_output=True, text=True)


def test_evaluate_cli_grid_then_summary(tmp_path, tiny_model_dir):
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([{"name": "ner", "family": "token_classification", "max_length": 32,
                                  "path": str(make_task_folder(tmp_path / "ner", "token_classification",
                                                               sizes=(16, 8, 8)))}]))
    out = tmp_path / "out"
    result = run_cli("grid", "--model", f"tiny={tiny_model_dir}", "--tasks", tasks, "--lrs", "1e-3", "--seeds", "0",
                     "1", "--max-steps", "2", "--batch-size", "8", "--output", out)
    assert result.returncode == 0, result.stderr
    summary = (out / "summary.md").read_text()
    assert "| tiny | token_classification | ner | entity_f1 | 0.001 |" in summary
    # 2 steps a run: said on the console (once per model and task) and marked in the summary's steps column
    assert result.stderr.count("warning: tiny/ner: 2 optimizer steps per run") == 1, result.stderr
    assert summary.splitlines()[[i for i, line in enumerate(summary.splitlines()) if "| ner |" in line][0]].endswith(
        "| 2 ⚠ |")
    (out / "summary.md").unlink()
    assert run_cli("summary", "--output", out).returncode == 0 and (out / "summary.md").exists()
    # ours is rewritten at will; someone's summary.json there is replaced only with --force (issue 56)
    from tools.evaluate import main as evaluate

    assert evaluate(["summary", "--output", str(out)]) == 0
    (out / "summary.json").write_text('{"mine": 1}\n')
    assert evaluate(["summary", "--output", str(out)]) == 2
    assert (out / "summary.json").read_text() == '{"mine": 1}\n'
    assert evaluate(["summary", "--output", str(out), "--force"]) == 0
    assert "tasks" in json.loads((out / "summary.json").read_text())


def test_evaluate_cli_bad_task_file_fails_clearly(tmp_path, tiny_model_dir):
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([{"name": "x", "family": "classification"}]))
    result = run_cli("grid", "--model", f"tiny={tiny_model_dir}", "--tasks", tasks, "--output", tmp_path / "o")
    assert result.returncode == 2 and "exactly one of `path` and `hf_name`" in result.stderr
    assert not (tmp_path / "o" / "summary.md").exists()


def test_user_tasks_get_a_floor_of_steps_and_the_paper_suite_keeps_its_budgets():
    from mlmclm.eval.finetune.protocol import CUSTOM_MIN_STEPS, ProtocolConfig
    from mlmclm.eval.finetune.training import FinetuneConfig, budget_steps

    # a 48-row task at batch 32 and one epoch: 2 steps before; now repeated up to the floor, never past max_steps
    assert budget_steps(48, FinetuneConfig(1e-4, batch_size=32, max_epochs=1, max_steps=1000)) == 2
    assert budget_steps(48, FinetuneConfig(1e-4, batch_size=32, max_epochs=1, max_steps=1000, min_steps=100)) == 100
    assert budget_steps(48, FinetuneConfig(1e-4, batch_size=32, max_epochs=1, max_steps=60, min_steps=100)) == 60
    assert budget_steps(48_000, FinetuneConfig(1e-4, batch_size=32, max_epochs=1, min_steps=100)) == 1000
    assert ProtocolConfig.paper().finetune_config(1e-4, 0, "classification").min_steps is None
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("evaluate_cli", Path(__file__).resolve().parents[2] / "tools" /
                                                  "evaluate.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    args = cli.build_parser().parse_args(["grid", "--model", "m=x", "--tasks", "t.json", "--output", "o"])
    assert cli._protocol(args).min_steps == CUSTOM_MIN_STEPS  # user tasks: the floor by default
    args = cli.build_parser().parse_args(["grid", "--model", "m=x", "--tasks", "t.json", "--output", "o",
                                          "--min-steps", "0"])
    assert cli._protocol(args).min_steps is None
