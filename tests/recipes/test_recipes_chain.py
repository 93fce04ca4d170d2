"""The two-task experiment: CLM task, then an MLM task that depends on it and starts from its final checkpoint."""
import json
from pathlib import Path

import torch

from mlmclm.convert.dist_reader import DistCheckpointReader
from mlmclm.model.hf_mapping import megatron_names
from recipes.__main__ import main
from recipes.rank import task_of_script

MLM_LR = 1e-7  # so small that 2 MLM steps move no weight by more than ~2e-7


def _weights(iter_dir: Path) -> dict[str, torch.Tensor]:
    reader = DistCheckpointReader(iter_dir)
    return {name: reader.read(name).float() for name in megatron_names(reader.saved_layers())}


def test_mlm_task_starts_from_the_clm_tasks_checkpoint(nemo_home, tmp_path, tiny_data):
    clm_dir, mlm_dir = tmp_path / "clm", tmp_path / "mlm"
    # one rank a task: the test is about the second task's start from the first's weights
    rc = main(["tiny_clm", "steps=4", "processes=1", f"run_dir={clm_dir}", f"data_path={tiny_data}",
               "--then", "tiny_mlm", "then.steps=2", "then.processes=1", f"then.run_dir={mlm_dir}",
               f"then.data_path={tiny_data}",
               f"then.optimizer.lr={MLM_LR}", "--executor", "local", "executor.gpus=false", "--name", "chain"])
    assert rc == 0

    clm_final = clm_dir / "checkpoints" / "iter_0000004"
    mlm_config = json.loads((mlm_dir / "checkpoints" / "iter_0000002" / "run_config.json").read_text())
    assert mlm_config["checkpoint"]["init_from"] == str(clm_dir)
    assert [p["objective"]["kind"] for p in mlm_config["phases"]] == ["mlm"]
    logs = "".join(p.read_text() for p in Path(nemo_home).rglob("*.log") if "tiny_mlm" in str(p))
    assert f"initialised weights from {clm_final}" in logs
    # each task's ranks ran its script (python -m recipes.rank): the config each run recorded is the one in it
    for name, run_dir in (("tiny_clm", clm_dir), ("tiny_mlm", mlm_dir)):
        (script,) = Path(nemo_home).rglob(f"{name}/scripts/{name}.sh")
        recorded = json.loads(next((run_dir / "checkpoints").glob("iter_*/run_config.json")).read_text())
        assert task_of_script(script.read_text())[0] == recorded, name

    # The MLM run's first checkpoint equals the CLM's final weights up to its tiny learning rate, while CLM
    # training itself moved the weights by far more between its own checkpoints (so a fresh start would show).
    clm_mid, clm_end = _weights(clm_dir / "checkpoints" / "iter_0000002"), _weights(clm_final)
    mlm_first = _weights(mlm_dir / "checkpoints" / "iter_0000001")
    assert clm_end.keys() == mlm_first.keys()
    moved_by_clm = max((clm_end[k] - clm_mid[k]).abs().max().item() for k in clm_end)
    mlm_vs_clm = max((mlm_first[k] - clm_end[k]).abs().max().item() for k in clm_end)
    assert moved_by_clm > 1e-4
    assert mlm_vs_clm < 1e-5
