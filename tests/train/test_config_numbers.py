"""Numbers of the training config are finite and in range, and run_dir is a folder: refused when the config is
built (the train CLI's `from_file`, and the recipes' `validate` before NeMo-Run launches anything), naming the
field. Before, each of these passed and the run failed (or trained into NaN) after its processes had started."""
import json

import pytest

import train_scenarios as sc
from mlmclm.train.config import TrainConfig
from recipes import launch

# (override as typed on a command line, the field the refusal names)
HOSTILE = [
    ("optimizer.lr=NaN", "optimizer.lr"),
    ("optimizer.lr=Infinity", "optimizer.lr"),
    ("optimizer.weight_decay=Infinity", "optimizer.weight_decay"),
    ("optimizer.clip_grad=NaN", "optimizer.clip_grad"),
    ("optimizer.eps=Infinity", "optimizer.eps"),
    ("model.rope_theta=NaN", "model.rope_theta"),
    ("model.norm_eps=NaN", "model.norm_eps"),
    ("model.init_std=NaN", "model.init_std"),
    ("model.init_std=-5", "model.init_std"),
    ("logging.peak_tflops=NaN", "logging.peak_tflops"),
    ("global_batch_size=1e12", "global_batch_size"),               # JSON makes it a float
    ("global_batch_size=1000000000000", "global_batch_size"),
    ("model.hidden_size=1e9", "hidden_size"),
    ("model.hidden_size=1000000000", "hidden_size"),
    ("model.max_position_embeddings=10000000000", "model.max_position_embeddings"),
]


def _from_file(tmp_path, item):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(sc.config(tmp_path / "run", tmp_path / "data")))
    return TrainConfig.from_file(config, [item])


@pytest.mark.parametrize("item, field", HOSTILE)
def test_the_train_cli_refuses_non_finite_and_out_of_range_numbers(tmp_path, item, field):
    with pytest.raises((ValueError, TypeError), match=field.replace(".", r"\.")):
        _from_file(tmp_path, item)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("item, field", HOSTILE)
def test_a_recipe_refuses_them_before_launching(tmp_path, item, field):
    with pytest.raises((ValueError, TypeError), match=field.replace(".", r"\.")):
        launch.build("tiny_clm_mlm", [item, f"run_dir={tmp_path / 'run'}"])
    assert not (tmp_path / "run").exists()


def test_a_run_dir_that_is_a_file_or_lies_in_one_is_refused(tmp_path):
    file = tmp_path / "notes.txt"
    file.write_text("mine")
    for run_dir, words in ((file, "it is a file"), (file / "run", f"it lies inside {file}, which is a file")):
        with pytest.raises(ValueError, match=f"run_dir {run_dir}: {words}, not a folder"):
            _from_file(tmp_path, f"run_dir={run_dir}")
        with pytest.raises(ValueError, match=f"run_dir {run_dir}: {words}, not a folder"):
            launch.build("tiny_clm_mlm", [f"run_dir={run_dir}"])
    assert file.read_text() == "mine"


def test_finite_numbers_in_range_and_a_new_or_existing_folder_pass(tmp_path):
    assert _from_file(tmp_path, "optimizer.lr=1e-3").optimizer.lr == 1e-3
    assert _from_file(tmp_path, "model.init_std=0").model.init_std == 0
    (tmp_path / "existing").mkdir()
    assert _from_file(tmp_path, f"run_dir={tmp_path / 'existing'}").run_dir == str(tmp_path / "existing")
