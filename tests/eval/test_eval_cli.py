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
    assert "| tiny | token_classification | ner | entity_f1 | 0.001 |" in (out / "summary.md").read_text()
    (out / "summary.md").unlink()
    assert run_cli("summary", "--output", out).returncode == 0 and (out / "summary.md").exists()


def test_evaluate_cli_bad_task_file_fails_clearly(tmp_path, tiny_model_dir):
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([{"name": "x", "family": "classification"}]))
    result = run_cli("grid", "--model", f"tiny={tiny_model_dir}", "--tasks", tasks, "--output", tmp_path / "o")
    assert result.returncode == 2 and "exactly one of `path` and `hf_name`" in result.stderr
    assert not (tmp_path / "o" / "summary.md").exists()
