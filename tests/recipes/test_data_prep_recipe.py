"""The partitioned data preparation recipe: a Slurm array of prepare jobs + a dependent merge (dry run), and the
job functions themselves run here."""
from pathlib import Path

import fiddle as fdl
from nemo_run.core.serialization.zlib_json import ZlibJSONSerializer

from recipes.data_prep import main, merge_parts, prepare_part


def test_slurm_dryrun_is_an_array_then_a_merge(nemo_home, tmp_path):
    rc = main(["output=/data/fw_2048", "tokenizer=EuroBERT/EuroBERT-210m", "seq_length=2048",
               "dataset=HuggingFaceFW/fineweb-edu", "dataset_config=sample-100BT", "partitions=16", "workers=15",
               "--executor", "slurm", "executor.account=acct", "executor.partition=cpu",
               f"executor.job_dir={tmp_path / 'jobs'}", "executor.data_dir=/lustre/data", "--dryrun"])
    assert rc == 0
    scripts = {p.name: p.read_text() for p in Path(nemo_home).rglob("*_sbatch.sh")}
    assert set(scripts) == {"prepare_parts_sbatch.sh", "merge_parts_sbatch.sh"}
    parts = scripts["prepare_parts_sbatch.sh"].splitlines()
    for line in ("#SBATCH --array=0-15", "#SBATCH --nodes=1", "#SBATCH --cpus-per-task=16", "#SBATCH --account=acct",
                 "#SBATCH --partition=cpu"):
        assert line in parts, line
    assert not any("gpus" in line or "--exclusive" in line for line in parts)
    assert any("%A_%a" in line for line in parts)                   # one log per array element
    srun = next(line for line in parts if line.startswith("srun "))
    assert "torchrun" not in srun and "/lustre/data:/data" in srun
    assert "nemo_run.core.runners.fdl_runner -n prepare_parts" in srun
    assert "#SBATCH --array" not in scripts["merge_parts_sbatch.sh"]
    (serialised,) = Path(nemo_home).rglob("configs/prepare_parts_fn_or_script")
    partial = ZlibJSONSerializer().deserialize(serialised.read_text())
    assert fdl.get_callable(partial) is prepare_part
    assert (partial.partition, partial.num_partitions, partial.seq_length, partial.dataset) == \
           ("slurm", 16, 2048, "HuggingFaceFW/fineweb-edu")
    (merge,) = Path(nemo_home).rglob("configs/merge_parts_fn_or_script")
    assert ZlibJSONSerializer().deserialize(merge.read_text()).output == "/data/fw_2048"


def test_job_functions_prepare_and_merge(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLMCLM_CACHE", str(tmp_path / "cache"))
    out = str(tmp_path / "demo")
    for task in range(3):
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", str(task))
        prepare_part("slurm", 3, out, seq_length=128, embedded=True, workers=1, group_docs=5)
    merged = merge_parts(out)
    assert merged["samples"] > 0 and Path(merged["location"]).exists()
    assert main(["seq_length=8"]) == 2 and "output= is required" in capsys.readouterr().err
