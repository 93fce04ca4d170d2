"""A pickled weight file from others (`pytorch_model.bin`): plain tensors are read, anything else is one line naming
the file and what its pickle asked for — never torch's advice to pass `weights_only=False` — and nothing in it ran.
Covered where such files are read: convert_from_hf and the evaluation's models."""
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from mlmclm.pickled_weights import PickledWeightsError, load_plain_tensors

REPO = Path(__file__).resolve().parents[1]


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _tensors():
    return {"model.embed_tokens.weight": torch.ones(4, 2), "lm_head.weight": torch.zeros(4, 2)}


def test_plain_tensors_load_in_both_formats(tmp_path):
    torch.save(_tensors(), tmp_path / "zip.bin")
    torch.save(_tensors(), tmp_path / "legacy.bin", _use_new_zipfile_serialization=False)  # mmap refused it
    for name in ("zip.bin", "legacy.bin"):
        assert torch.equal(load_plain_tensors(tmp_path / name)["model.embed_tokens.weight"], torch.ones(4, 2))


@pytest.mark.parametrize("kind, words", [
    ("hostile", "its pickle asks for posix.system, which is not a tensor"),
    ("legacy_numpy", "its pickle asks for numpy"),
])
def test_a_pickle_holding_more_than_tensors_is_one_line_without_the_unsafe_advice(tmp_path, kind, words):
    marker = tmp_path / "MARKER"
    path = tmp_path / "pytorch_model.bin"
    if kind == "hostile":
        torch.save({**_tensors(), "x": _Payload(marker)}, path)
    else:  # an old training script's file: a numpy scalar saved beside the tensors, pre-zip format
        torch.save({**_tensors(), "step": np.int64(3)}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(PickledWeightsError) as caught:
        load_plain_tensors(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: refused: {words}") and "\n" not in message
    assert "weights_only" not in message and not marker.exists()


def _hostile_model(directory: Path, marker: Path) -> Path:
    """The evaluation fixtures' tiny EuroBERT, its weights as a pytorch_model.bin that also carries a payload."""
    import sys

    sys.path.insert(0, str(REPO / "tests" / "eval"))
    from eval_fixtures import save_tiny_model
    from safetensors.torch import load_file

    save_tiny_model(directory)
    weights = load_file(str(directory / "model.safetensors"))
    (directory / "model.safetensors").unlink()
    torch.save({**weights, "x": _Payload(marker)}, directory / "pytorch_model.bin")
    return directory


def _tool(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_the_tools_refuse_it_in_one_line_and_exit_2(tmp_path, capsys):
    """Before: convert_from_hf and evaluate.py grid ended in torch's UnpicklingError traceback, advising
    weights_only=False (evaluate.py after its first fine-tune had started)."""
    marker = tmp_path / "MARKER"
    model = _hostile_model(tmp_path / "model", marker)
    bin_path = model / "pytorch_model.bin"
    capsys.readouterr()  # the fixture's own progress lines
    assert _tool("convert_from_hf")([str(model), str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bin_path}: refused: its pickle asks for posix.system") and err.count("\n") == 1
    tasks = tmp_path / "tasks.json"
    folder = tmp_path / "task"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": f"w{i}", "label": i % 2}) + "\n"
                                                for i in range(8)))
    tasks.write_text(json.dumps([{"name": "t", "family": "classification", "path": str(folder)}]))
    assert _tool("evaluate")(["grid", "--model", f"m={model}", "--tasks", str(tasks), "--lrs", "1e-3", "--seeds",
                              "0", "--max-steps", "1", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"evaluate: error: {bin_path}: refused: its pickle asks for posix.system")
    assert err.count("\n") == 1 and "weights_only" not in err
    assert not marker.exists() and not (tmp_path / "run").exists() and not (tmp_path / "out" / "runs").exists()
