"""A checkpoint is never saved from NaN weights, and the abort message claims nothing about a NaN checkpoint.

With optimizer.lr=Infinity (refused at config now) the update of step 1 made every weight NaN while its loss was
finite; the periodic saves wrote NaN models and the abort called the last one intact."""
import json

import train_scenarios as sc
from mlmclm.parallel.launch import spawn
from mlmclm.train import checkpoint as ckpt


def test_weights_that_turn_nan_are_never_saved(data, tmp_path):
    run_dir = tmp_path / "nan_weights"
    cfg = sc.config(run_dir, data, tp=1, checkpoint={"save_interval": 2})
    spawn(sc.run_with_nan_weights_after, 1, cfg, 3, tmp_path / "error.json")
    report = json.loads((tmp_path / "error.json").read_text())
    last = run_dir / "checkpoints" / "iter_0000002"
    assert report["type"] == "NonFiniteWeightsError", report
    assert report["message"].startswith("step 4: the weights hold NaN or infinity (parameter ")
    assert f"not saved as a checkpoint; the last checkpoint, {last}, was saved before them" in report["message"]
    assert ckpt.latest_checkpoint(run_dir / "checkpoints") == last
    assert not (run_dir / "checkpoints" / "iter_0000004").exists()
