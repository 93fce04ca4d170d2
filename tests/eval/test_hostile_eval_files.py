"""Files from others that `evaluate.py curve` and `grid` read — a run's train_state.json, the task data, a data
root's manifest, the task list, run records, a model directory's files — are read bounded: a FIFO (a plain read
blocked `curve` forever) or a device is refused naming the path, at once. A run record is reused only for the
data it read."""
import json
import os
import re
import time

import pytest
from eval_fixtures import evaluate_main, make_task_folder

from mlmclm.bounded_read import FileRefusedError
from mlmclm.eval.data.data_root import read_manifest
from mlmclm.eval.finetune.protocol import ProtocolConfig, run_path
from mlmclm.eval.finetune.task_loading import load_task
from mlmclm.eval.finetune.task_spec import TaskSpec, load_task_specs
from mlmclm.eval.grid.run import run_grid
from mlmclm.eval.reports.data_efficiency import evaluate_checkpoints

FIFO = "a FIFO (named pipe), not a regular file"
PROTOCOL = ProtocolConfig(learning_rates=(1e-3,), seeds=(0,), max_steps=1, batch_size=8)


def _refused(call, path) -> None:
    started = time.monotonic()
    with pytest.raises(FileRefusedError, match=re.escape(f"{path}: refusing to read this") + ".*" + re.escape(FIFO)):
        call()
    assert time.monotonic() - started < 5


@pytest.mark.timeout(30)
def test_curve_refuses_a_fifo_train_state_at_once(tmp_path):
    """The old code's read_text blocked on the FIFO until a writer came (forever)."""
    state = tmp_path / "run" / "checkpoints" / "iter_0000001" / "train_state.json"
    state.parent.mkdir(parents=True)
    os.mkfifo(state)
    _refused(lambda: evaluate_checkpoints(tmp_path / "run", [], tmp_path / "out", PROTOCOL, progress=False), state)
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(30)
def test_task_files_a_manifest_and_a_task_list_that_are_fifos_are_refused(tmp_path):
    folder = make_task_folder(tmp_path / "task", "classification", sizes=(8, 4, 4))
    (folder / "validation.jsonl").unlink()
    os.mkfifo(folder / "validation.jsonl")
    _refused(lambda: load_task(TaskSpec(name="t", family="classification", path=str(folder))),
             folder / "validation.jsonl")
    parquet = make_task_folder(tmp_path / "pq", "classification", sizes=(8, 4, 4))
    (parquet / "train.jsonl").unlink()
    os.mkfifo(parquet / "train.parquet")
    _refused(lambda: load_task(TaskSpec(name="t", family="classification", path=str(parquet))),
             parquet / "train.parquet")
    os.mkfifo(tmp_path / "manifest.json")
    _refused(lambda: read_manifest(tmp_path), tmp_path / "manifest.json")
    os.mkfifo(tmp_path / "tasks.json")
    _refused(lambda: load_task_specs(tmp_path / "tasks.json"), tmp_path / "tasks.json")


@pytest.mark.timeout(60)
def test_a_fifo_run_record_or_model_file_is_refused_before_any_run(tmp_path, tiny_model_dir):
    folder = make_task_folder(tmp_path / "task", "classification", sizes=(8, 4, 4))
    spec = TaskSpec(name="t", family="classification", path=str(folder), max_length=16)
    record = run_path(tmp_path / "out", "m", "t", 1e-3, 0)
    record.parent.mkdir(parents=True)
    os.mkfifo(record)
    _refused(lambda: run_grid({"m": tiny_model_dir}, [spec], tmp_path / "out", PROTOCOL, progress=False), record)
    model = tmp_path / "model"
    model.mkdir()
    for item in tiny_model_dir.iterdir():
        (model / item.name).symlink_to(item)
    (model / "tokenizer.json").unlink()
    os.mkfifo(model / "tokenizer.json")   # transformers would block on it
    _refused(lambda: run_grid({"m": model}, [spec], tmp_path / "out2", PROTOCOL, progress=False),
             model / "tokenizer.json")
    assert not (tmp_path / "out2").exists()


def test_a_record_is_not_reused_after_its_data_changed(tmp_path, tiny_model_dir):
    """Same path, same row count, other rows: the old fingerprint covered the task's path only, and the record
    (which still named the old rows) was reused."""
    folder = make_task_folder(tmp_path / "task", "classification", sizes=(8, 4, 4))
    spec = TaskSpec(name="t", family="classification", path=str(folder), max_length=16)
    out = tmp_path / "out"
    run_grid({"m": tiny_model_dir}, [spec], out, PROTOCOL, progress=False)
    record = run_path(out, "m", "t", 1e-3, 0)
    first = json.loads(record.read_text())
    run_grid({"m": tiny_model_dir}, [spec], out, PROTOCOL, progress=False)
    assert json.loads(record.read_text()) == first  # the same data: reused
    train = folder / "train.jsonl"
    lines = train.read_text().splitlines()
    lines[0] = json.dumps({"text": "a very good film", "label": "pos"})
    train.write_text("\n".join(lines) + "\n")
    run_grid({"m": tiny_model_dir}, [spec], out, PROTOCOL, progress=False)
    second = json.loads(record.read_text())
    assert second["fingerprint"] != first["fingerprint"]
    assert second["extra"]["data"]["train"]["rows"] == first["extra"]["data"]["train"]["rows"] == 8
    assert second["extra"]["data"]["train"]["sha256"] != first["extra"]["data"]["train"]["sha256"]


GOOD_RECORD = {"model": "m", "task": "t", "family": "classification", "main_metric": "accuracy",
               "learning_rate": 1e-3, "seed": 0, "validation": {"accuracy": 0.5}, "test": {"accuracy": 0.5},
               "diverged": False, "steps": 1, "train_loss_first": 0.7, "train_loss_last": 0.6, "fingerprint": "f",
               "extra": {"notes": [], "data": {"train": {"origin": "x", "rows": 8}}}}


@pytest.mark.parametrize("record, words", [
    ("[1, 2]", "not a run record: expected a JSON object, got list"),
    ("{not json", "not a run record: not valid JSON"),
    (json.dumps({**GOOD_RECORD, "validation": [0.5]}), "field 'validation' must be an object of metric -> number"),
    (json.dumps({**GOOD_RECORD, "test": {"accuracy": "high"}}), "field 'test' must be"),
    (json.dumps({k: v for k, v in GOOD_RECORD.items() if k != "seed"}), "not a run record: no field 'seed'"),
    (json.dumps({**GOOD_RECORD, "extra": {"data": ["train"]}}), "field 'extra.data' must be"),
    (json.dumps({**GOOD_RECORD, "family": "poetry"}), "field 'family' must be one of"),
])
def test_summary_over_a_bad_run_json_is_one_line_naming_it_and_exit_2(tmp_path, capsys, record, words):
    """The old code ended in a TypeError or AttributeError traceback."""
    path = tmp_path / "runs" / "m" / "t" / "lr0.001_seed0.json"
    path.parent.mkdir(parents=True)
    path.write_text(record)
    assert evaluate_main()(["summary", "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"evaluate: error: {path}: {words}") and err.count("\n") == 1, err
    assert not (tmp_path / "summary.md").exists()
    path.write_text(json.dumps(GOOD_RECORD))
    assert evaluate_main()(["summary", "--output", str(tmp_path)]) == 0


def test_a_model_label_too_long_for_a_file_name_is_refused_before_any_fine_tuning(tmp_path, capsys,
                                                                                 tiny_model_dir):
    """The old code fine-tuned, then could not write the record (`File name too long`): the work was lost."""
    folder = make_task_folder(tmp_path / "task", "classification", sizes=(8, 4, 4))
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([{"name": "t", "family": "classification", "path": str(folder), "max_length": 16}]))
    out = tmp_path / "out"
    label = "m" * 300
    assert evaluate_main()(["grid", "--model", f"{label}={tiny_model_dir}", "--tasks", str(tasks), "--lrs", "1e-3",
                             "--seeds", "0", "--max-steps", "1", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("evaluate: error: model label is 300 bytes long, more than the 255 a file name may hold")
    assert err.count("\n") == 1 and not out.exists()  # no run was made (its record would be under out)
