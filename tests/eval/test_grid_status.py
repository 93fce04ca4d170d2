"""What the grid says of itself (issue 53 parts 2, 4, 5): a unit that fails is recorded with why, the others finish,
the command ends 1 and a later command runs it once more; `status OUT` reads done / running (by which worker,
since when) / failed (why) / left from the files alone; `grid --list` prices the suite per model in GPU-hours and
wall time on K GPUs from the model's FLOPs; progress is one line per finished unit with the grid's ETA, a bar only
on a terminal."""
import io
import json
import os
import re
import time

import pytest
from eval_fixtures import evaluate_main, make_task_folder

from mlmclm import flops
from mlmclm.eval.finetune.protocol import ProtocolConfig, RunRecord, run_path
from mlmclm.eval.finetune.task_spec import TaskSpec
from mlmclm.eval.grid import units as grid_units
from mlmclm.eval.grid.claims import ClaimStore
from mlmclm.eval.grid.cost import EncoderShape, training_flops
from mlmclm.eval.grid.run import GridOutcome, evaluate_grid
from mlmclm.eval.grid.status import grid_status
from mlmclm.progress_log import GridProgress


@pytest.fixture
def task_list(tmp_path):
    folder = make_task_folder(tmp_path / "data", "classification", sizes=(16, 8, 8))
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([{"name": "cls", "family": "classification", "path": str(folder), "max_length": 16}]))
    return path


def test_a_failed_unit_is_recorded_the_others_finish_and_a_later_command_runs_it_once_more(
        tiny_model_dir, task_list, tmp_path, monkeypatch, capsys):
    real = grid_units.finetune_and_score

    def failing(model_dir, data, config):
        if config.seed == 1:
            raise RuntimeError("boom: this unit cannot run")
        return real(model_dir, data, config)

    monkeypatch.setattr(grid_units, "finetune_and_score", failing)
    out = tmp_path / "out"
    arguments = ["grid", "--model", f"m={tiny_model_dir}", "--tasks", str(task_list), "--lrs", "1e-3", "--seeds", "0",
                 "1", "--max-steps", "2", "--min-steps", "0", "--batch-size", "8", "--device", "cpu", "--output",
                 str(out)]
    assert evaluate_main()(arguments) == 1
    out_text, err = capsys.readouterr()
    assert re.search(r"^spent: 1 of 2 units finished, [0-9.]+ CPU-worker-hours by their records; this command ran 1 "
                     r"in [0-9.]+ min of wall time \([0-9.]+ units per hour\)$", out_text, flags=re.M), out_text
    assert "evaluate: error: m/cls/lr0.001_seed1 failed: RuntimeError: boom: this unit cannot run" in err
    assert run_path(out, "m", "cls", 1e-3, 0).exists() and not run_path(out, "m", "cls", 1e-3, 1).exists()
    status = grid_status(out)
    assert status.startswith(f"{out}: 2 units (plan written ") and "1 done, 0 running, 1 failed, 0 left" in status
    assert re.search(r"^  m/cls/lr0.001_seed1  by [^ ]+:\d+:[0-9a-f]+ at [0-9-]+ [0-9:]+: RuntimeError: boom: this "
                     r"unit cannot run$", status, flags=re.M), status

    # a later command runs it once more (here: without the fault), and clears the failure
    monkeypatch.setattr(grid_units, "finetune_and_score", real)
    assert evaluate_main()(arguments) == 0
    out_text, err = capsys.readouterr()
    assert "1 finished, 1 to run" in err
    # what was spent counts every finished unit's record, the earlier command's too; what this command ran, its own
    seconds = sum(json.loads(run_path(out, "m", "cls", 1e-3, seed).read_text())["seconds"] for seed in (0, 1))
    assert (f"spent: 2 of 2 units finished, {seconds / 3600:.3f} CPU-worker-hours by their records; this command "
            f"ran 1 in ") in out_text, out_text
    assert "2 done, 0 running, 0 failed, 0 left" in grid_status(out) and not list((out / "failed").rglob("*.json"))


def test_what_was_spent_is_the_records_device_hours_and_this_commands_units_per_hour():
    def record(seconds, **extra):
        return RunRecord(model="m", task="t", family="classification", main_metric="accuracy", learning_rate=1e-4,
                         seed=0, validation={}, test={}, diverged=False, steps=1, train_loss_first=1.0,
                         train_loss_last=1.0, fingerprint="f", seconds=seconds, extra=extra)

    # a retrieval unit's extra sets repeat its seconds (trained once): counted once; one unit of three unfinished
    records = [record(1800.0), record(5400.0), record(5400.0, trained_on="t")]
    outcome = GridOutcome(units=[None] * 3, records=records, ran_here=2, wall_seconds=3600.0)
    assert outcome.spent("cuda") == ("spent: 2 of 3 units finished, 2.000 GPU-hours by their records; this command "
                                     "ran 2 in 60.0 min of wall time (2.0 units per hour)")
    fast = GridOutcome(units=[None] * 3, records=records[:2], ran_here=2, wall_seconds=36.0)
    assert fast.spent("cpu").endswith("2.000 CPU-worker-hours by their records; this command ran 2 in 0.6 min of "
                                      "wall time (200 units per hour)")
    idle = GridOutcome(units=[None] * 3, records=records[:2], ran_here=0, wall_seconds=0.0)  # nothing left to run
    assert idle.spent("cpu").endswith("this command ran 0 in 0.0 min of wall time (0.0 units per hour)")


def test_status_says_which_worker_runs_what_since_when_and_what_is_left(tiny_model_dir, task_list, tmp_path):
    out = tmp_path / "out"
    spec = TaskSpec(**json.loads(task_list.read_text())[0])
    protocol = ProtocolConfig(learning_rates=(1e-3,), seeds=(0, 1, 2), max_steps=2, batch_size=8)
    evaluate_grid({"m": tiny_model_dir}, [spec], out, protocol, progress=False)
    for seed in (1, 2):
        run_path(out, "m", "cls", 1e-3, seed).unlink()
    store = ClaimStore(out, worker="node7:4242:abcdef")  # a worker of another node, mid-unit
    assert store.claim("m/cls/lr0.001_seed1", "fp")
    claim = json.loads(store.path("m/cls/lr0.001_seed1").read_text())
    claim.update(host="node7", since=time.time() - 150)
    store.path("m/cls/lr0.001_seed1").write_text(json.dumps(claim))
    beat = time.time() - 5
    os.utime(store.path("m/cls/lr0.001_seed1"), (beat, beat))
    status = grid_status(out)
    assert "3 units" in status and "1 done, 1 running, 0 failed, 1 left" in status, status
    assert re.search(r"^  m/cls/lr0.001_seed1  by node7:4242:abcdef  since [0-9-]+ [0-9:]+ \(2\.5 min\)  last beat "
                     r"[5-9] s ago$", status, flags=re.M), status
    assert "left: 1 units, e.g. m/cls/lr0.001_seed2" in status
    old = time.time() - 3600
    os.utime(store.path("m/cls/lr0.001_seed1"), (old, old))
    assert "last beat 60.0 min ago, stale: the next worker to look takes it over" in grid_status(out)


def test_list_prices_the_suite_per_model_in_gpu_hours_and_wall_time(tiny_model_dir, capsys):
    from mlmclm.model.config import PRESETS

    assert evaluate_main()(["grid", "--list", "--task", "sst2", "--gpus", "4", "--mfu", "0.2"]) == 0
    text = capsys.readouterr().out
    assert "cost per model, fine-tuning only, at 20% MFU of the H100 bf16 peak (assumed, not measured), wall time " \
           "with the longest runs first on 4 GPUs:" in text
    # sst2: 1000 steps of 32 rows of ~13 tokens, 6 LRs x 5 seeds; 30 equal runs on 4 GPUs: 8 runs on the busiest
    shape = EncoderShape.of_model_config(PRESETS["eurobert-610m"])
    run_hours = training_flops(shape, 1000, 32, 13) / (0.2 * flops.peak_flops("bf16", "H100")) / 3600
    assert f"  eurobert-610m: 30 runs, {30 * run_hours * 60:.1f} min GPU-hours, {8 * run_hours * 60:.1f} min on 4 " \
           f"GPUs" in text, text
    assert "tokens per training row assumed: sst2 13" in text
    assert evaluate_main()(["grid", "--list", "--task", "conll2003", "--model", f"tiny={tiny_model_dir}"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^  tiny: 30 runs, [0-9.]+ min GPU-hours, [0-9.]+ min on 8 GPUs$", text, flags=re.M), text
    assert "training rows assumed (no --data-root): conll2003 14,041" in text


def test_a_modernbert_model_is_priced_with_its_local_layers_windows():
    """A ModernBERT config.json (transformers' own fields): its local layers attend to a window, so a long row costs
    less than the same shape attending to the whole row on every layer; the old shape had no local layers and
    `grid --list` ended in an AttributeError on every model (flops reads them since ModernBERT, issue 57)."""
    from transformers import ModernBertConfig

    config = ModernBertConfig(hidden_size=256, num_hidden_layers=6, num_attention_heads=4, intermediate_size=384,
                              local_attention=16, global_attn_every_n_layers=3).to_dict()
    shape = EncoderShape.from_hf_config(config)
    assert shape.local_layers() == [False, True, True, False, True, True] and shape.half_window == 8
    older = {key: value for key, value in config.items() if key != "layer_types"}  # transformers 4's fields
    assert EncoderShape.from_hf_config(older).local_layers() == shape.local_layers()
    every_layer_global = EncoderShape(256, 6, 4, 64, 384)
    assert training_flops(shape, 1, 1, 512) < training_flops(every_layer_global, 1, 1, 512)
    assert training_flops(shape, 1, 1, 8) == training_flops(every_layer_global, 1, 1, 8)  # rows inside the window


def test_progress_is_a_line_per_finished_unit_with_the_grids_eta_and_a_bar_only_on_a_terminal():
    costs = {"a": 1.0, "b": 1.0, "c": 2.0, "d": 4.0}
    log = io.StringIO()
    progress = GridProgress(costs, {"a"}, "evaluation runs", stream=log, interval=3600)
    progress.set_running(["x", "y"])
    progress.finished("b", "m/b lr=0.001 seed=0", 10.0)  # 10 s per unit of cost; 6 left over 2 workers: 30 s
    progress.finished("c", "m/c lr=0.001 seed=0", 30.0)  # 40 s for 3 of cost; 4 left over 2 workers: 27 s
    progress.close()
    lines = log.getvalue().splitlines()
    assert lines[0] == "evaluation runs: 2/4 done, 2 left, ETA 30 s; last finished: m/b lr=0.001 seed=0 in 10 s; " \
                       "running: x, y"
    assert lines[1].startswith("evaluation runs: 3/4 done, 1 left, ETA 27 s; last finished: m/c lr=0.001 seed=0")
    assert re.fullmatch(r"evaluation runs: 3/4 done in \d+ s", lines[2]) and len(lines) == 3

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    bar = GridProgress(costs, set(), "evaluation runs", stream=screen, interval=3600)
    for unit in costs:
        bar.finished(unit, unit, 2.0)
    bar.close()
    assert "\r" in screen.getvalue() and "4/4" in screen.getvalue() and "last finished" not in screen.getvalue()
