"""Slurm dry run of the 4-node 610m biphasic recipe: the sbatch script NeMo-Run would submit."""
from pathlib import Path

from cluster.executors import BASE_IMAGE
from mlmclm.train.config import TrainConfig
from recipes.__main__ import main
from recipes.rank import task_of_script

IMAGE = "/lustre/images/mlmclm.sqsh"


def test_slurm_dryrun_writes_the_sbatch_script(nemo_home, tmp_path, capsys):
    rc = main(["clm_mlm_610m", "nodes=4", "clm_share=0.5", "total_steps=22000", "--executor", "slurm",
               "executor.account=acct", "executor.partition=h100", f"executor.job_dir={tmp_path / 'jobs'}",
               "executor.data_dir=/lustre/fineweb", "executor.checkpoint_dir=/lustre/ckpt",
               f"executor.container_image={IMAGE}", "--dryrun"])
    assert rc == 0
    (script,) = Path(nemo_home).rglob("clm_mlm_610m_sbatch.sh")
    text = script.read_text()
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --account=acct", "#SBATCH --partition=h100", "#SBATCH --exclusive",
                 "#SBATCH --signal=USR1@120", "export CUDA_DEVICE_MAX_CONNECTIONS=1",
                 # 8 ranks per node: the torchrun task gets 8 cores per GPU, not Slurm's default single CPU.
                 "#SBATCH --cpus-per-task=64",
                 "export TORCHX_MAX_RETRIES=3",
                 # NVIDIA's recipe environment for NCCL and the CUDA allocator
                 "export TORCH_NCCL_AVOID_RECORD_STREAMS=1", "export NCCL_NVLS_ENABLE=0",
                 "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"):
        assert line in text.splitlines(), line
    srun = next(line for line in text.splitlines() if line.startswith("srun "))
    assert f"--container-image {IMAGE}" in srun
    assert {"--cpus-per-task=64", "--cpu-bind=cores"} <= set(srun.split())  # srun does not inherit sbatch's
    assert "/lustre/fineweb:/data,/lustre/ckpt:/checkpoints" in srun
    assert ("torchrun --rdzv-backend c10d --rdzv-endpoint $head_node_ip:29500" in srun
            and "--nnodes 4 --nproc-per-node 8 --node-rank $SLURM_NODEID" in srun)
    # each rank runs the task's script (python -m recipes.rank; NeMo-Run's own runner is not imported there)
    assert srun.endswith("--no-python /nemo_run/scripts/clm_mlm_610m.sh")
    # The task the script runs: the recipe, as built with the overrides.
    (script,) = Path(nemo_home).rglob("scripts/clm_mlm_610m.sh")
    config, nodes, gpus_per_node = task_of_script(script.read_text())
    cfg = TrainConfig.from_dict(config)
    assert (nodes, gpus_per_node) == (4, 8)
    assert cfg.model.name == "eurobert-610m" and [p.objective.kind for p in cfg.phases] == ["clm", "mlm"]
    # the paper's random-length samples: micro batches of 12 (12 × 1030 tokens per forward on average), accumulated 6
    # times
    assert cfg.phase_steps() == [11_000, 11_000] and (cfg.micro_batch_size, cfg.num_microbatches(32)) == (12, 6)
    assert cfg.data.random_length.max_length == 2048
    assert cfg.run_dir.startswith("/checkpoints/") and cfg.data.path.startswith("/data/")
    assert "experiment directory" in capsys.readouterr().out


def test_slurm_dryrun_of_a_chain_adds_the_dependent_task(nemo_home, tmp_path):
    rc = main(["clm_610m", "nodes=4", "total_steps=31500", "--then", "cpt_610m", "then.steps=10500",
               "then.nodes=2", "--executor", "slurm", "executor.account=acct",
               f"executor.job_dir={tmp_path / 'jobs'}", "--dryrun"])
    assert rc == 0
    scripts = {p.name: p.read_text() for p in Path(nemo_home).rglob("*_sbatch.sh")}
    assert set(scripts) == {"clm_610m_sbatch.sh", "cpt_610m_sbatch.sh"}
    assert "#SBATCH --nodes=4" in scripts["clm_610m_sbatch.sh"]
    assert "#SBATCH --nodes=2" in scripts["cpt_610m_sbatch.sh"]
    (script,) = Path(nemo_home).rglob("scripts/cpt_610m.sh")
    cpt = TrainConfig.from_dict(task_of_script(script.read_text())[0])
    assert cpt.checkpoint.init_from == "/checkpoints/mlmclm/610m-clm-31.5k"


def test_slurm_without_an_image_or_a_shared_filesystem_is_refused_at_submission(nemo_home, tmp_path, capsys,
                                                                                  monkeypatch):
    """No image: a bare-metal launch, which needs to know what the nodes share; neither given: refused, naming both."""
    monkeypatch.delenv("MLMCLM_CONTAINER_IMAGE", raising=False)
    monkeypatch.delenv("MLMCLM_SHARED_DIRS", raising=False)
    rc = main(["clm_mlm_610m", "nodes=4", "--executor", "slurm", "executor.account=acct",
               f"executor.job_dir={tmp_path / 'jobs'}", "--dryrun"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "bare-metal" in err and "MLMCLM_SHARED_DIRS" in err and "MLMCLM_CONTAINER_IMAGE" in err
    assert not list(Path(nemo_home).rglob("*_sbatch.sh"))  # nothing written, nothing submitted


def test_slurm_launch_on_a_bare_ngc_image_is_refused_at_submission(nemo_home, tmp_path, capsys):
    rc = main(["clm_mlm_610m", "nodes=4", "--executor", "slurm", "executor.account=acct",
               f"executor.job_dir={tmp_path / 'jobs'}", f"executor.container_image={BASE_IMAGE}", "--dryrun"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "is a bare NGC PyTorch image" in err and "MLMCLM_CONTAINER_IMAGE" in err and "cluster/Dockerfile" in err
    assert not list(Path(nemo_home).rglob("*_sbatch.sh"))


def test_slurm_cpus_per_task_is_configurable_and_checked(nemo_home, tmp_path, capsys):
    common = ["clm_mlm_610m", "nodes=1", "--executor", "slurm", "executor.account=acct",
              f"executor.job_dir={tmp_path / 'jobs'}", "--dryrun"]
    assert main([*common, "executor.cpus_per_task=96"]) == 0
    (script,) = Path(nemo_home).rglob("clm_mlm_610m_sbatch.sh")
    text = script.read_text()
    assert "#SBATCH --cpus-per-task=96" in text.splitlines() and "--cpus-per-task=96 --cpu-bind=cores" in text
    assert main([*common, "executor.cpus_per_task=4"]) == 2
    assert "cpus_per_task 4 is fewer than the 8 ranks" in capsys.readouterr().err


def test_first_hour_paths_under_no_mount_are_refused_naming_the_variable(nemo_home, tmp_path, capsys, monkeypatch):
    """Account and image set, nothing mounted: the recipe reads /data/... and writes /checkpoints/..., which the
    container would not have (no data; checkpoints written inside it and lost). Refused, naming what fixes it."""
    monkeypatch.delenv("MLMCLM_DATA_DIR"), monkeypatch.delenv("MLMCLM_CHECKPOINT_DIR")
    common = ["clm_mlm_210m", "nodes=1", "--executor", "slurm", "executor.account=acct",
              f"executor.job_dir={tmp_path / 'jobs'}", "--dryrun"]
    assert main(common) == 2
    err = capsys.readouterr().err
    assert "data_path /data/" in err and "under no container mount" in err and "MLMCLM_DATA_DIR" in err
    assert main([*common, "executor.data_dir=/lustre/data"]) == 2
    err = capsys.readouterr().err
    assert "run_dir /checkpoints/mlmclm/" in err and "MLMCLM_CHECKPOINT_DIR" in err
    assert not list(Path(nemo_home).rglob("*_sbatch.sh"))


def test_bare_metal_dryrun_says_its_mode_and_prints_the_sbatch_verbatim(nemo_home, tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.delenv("MLMCLM_CONTAINER_IMAGE"), monkeypatch.delenv("MLMCLM_DATA_DIR")
    monkeypatch.delenv("MLMCLM_CHECKPOINT_DIR")
    repo = str(Path(__file__).resolve().parents[2])
    shared = f"executor.shared_dirs={tmp_path}:{sys.prefix}:{repo}"
    common = ["tiny_clm_mlm", "nodes=2", "processes=1", "--executor", "slurm", "executor.account=acct",
              f"executor.job_dir={tmp_path / 'jobs'}", "executor.gpus=false", "executor.cpus_per_task=1", "--dryrun"]
    rc = main([*common, shared, f"data_path={tmp_path / 'data'}", f"run_dir={tmp_path / 'run'}"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"bare-metal mode (no container image): {sys.prefix}" in out
    assert "asks Slurm for 2 node(s) (whole, --exclusive) × no GPUs" in out
    (script,) = Path(nemo_home).rglob("tiny_clm_mlm_sbatch.sh")
    srun = next(line for line in script.read_text().splitlines() if line.startswith("srun "))
    assert len(srun) > 200 and srun in out.splitlines()  # printed whole, on one line
    assert "--container-image" not in srun and "--chdir" in srun
    assert f"export PATH={sys.prefix}/bin:$PATH" in out and "mlmclm.parallel.torchrun" in out
    # paths the nodes would not see: relative, or outside the shared directories
    for override, name in (("data_path=runs/demo_data", "data_path"), ("run_dir=/elsewhere/run", "run_dir")):
        assert main([*common, shared, f"data_path={tmp_path / 'data'}", f"run_dir={tmp_path / 'run'}",
                     override]) == 2
        err = capsys.readouterr().err
        assert f"error: {name} " in err and "MLMCLM_SHARED_DIRS" in err, err


def test_a_dry_run_prints_no_credential_of_the_data_location(nemo_home, tmp_path, capsys):
    """The plan names the data location (and the local executor's environment): a presigned URL's signature, a
    URL's user-info or an Authorization header are shown as <redacted>; the serialised task keeps the real value
    (the job needs it). The old plan printed them verbatim."""
    secret = "s3cr3t-V4lue"
    location = f"https://alice:{secret}@data.example.com/fw/manifest.json?X-Amz-Signature={secret}"
    rc = main(["tiny_clm_mlm", f"data_path={location}", f"run_dir={tmp_path / 'run'}", "--dryrun"])
    assert rc == 0
    out = capsys.readouterr()
    assert secret not in out.out + out.err
    assert "https://<redacted>@data.example.com/fw/manifest.json?X-Amz-Signature=<redacted>" in out.out
    (script,) = Path(nemo_home).rglob("scripts/tiny_clm_mlm.sh")
    assert task_of_script(script.read_text())[0]["data"]["path"] == location
