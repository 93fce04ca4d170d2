"""NeMo-Run executors: local torchrun (CPU or one node's GPUs) and Slurm multi-node H100 with a container.

Everything site-specific is an argument with a default read from `MLMCLM_*` environment variables, so a cluster
is configured by exporting a few variables (or passing `executor.KEY=VALUE` to `python -m recipes`), never by
editing code. `settings()` lists them.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import nemo_run as run

# The NGC PyTorch image cluster/Dockerfile builds on (CUDA, NCCL, Transformer Engine and apex built against its
# torch). It is not a runnable default: it has neither mlmclm, nemo_run nor megatron-core 0.19, so a job on it fails
# on the nodes. The image to run is the one built from cluster/Dockerfile (MLMCLM_CONTAINER_IMAGE).
BASE_IMAGE = "nvcr.io/nvidia/pytorch:26.06-py3"
BARE_NGC_PREFIX = "nvcr.io/nvidia/pytorch:"
CPUS_PER_GPU = 8  # default CPU cores per GPU rank for the node's torchrun task (data loading, host-side work)
DATA_MOUNT_TARGET, CHECKPOINT_MOUNT_TARGET = "/data", "/checkpoints"  # the paper recipes' default paths

# name -> (environment variable, default, help)
SETTINGS: dict[str, tuple[str, str | None, str]] = {
    "account": ("MLMCLM_SLURM_ACCOUNT", None, "Slurm account (required)"),
    "partition": ("MLMCLM_SLURM_PARTITION", None, "Slurm partition"),
    "time": ("MLMCLM_SLURM_TIME", "04:00:00", "wall-clock limit per job; resume continues after it"),
    "container_image": ("MLMCLM_CONTAINER_IMAGE", None,
                        "pyxis/enroot image built from cluster/Dockerfile (squashfs path or registry; required)"),
    "cpus_per_task": ("MLMCLM_SLURM_CPUS_PER_TASK", None,
                      f"CPU cores for each node's torchrun task and its ranks (default {CPUS_PER_GPU} per GPU)"),
    "data_dir": ("MLMCLM_DATA_DIR", None, f"host directory mounted at {DATA_MOUNT_TARGET}"),
    "checkpoint_dir": ("MLMCLM_CHECKPOINT_DIR", None, f"host directory mounted at {CHECKPOINT_MOUNT_TARGET}"),
    "job_dir": ("MLMCLM_SLURM_JOB_DIR", None, "shared directory for NeMo-Run's sbatch scripts and logs"),
    "host": ("MLMCLM_SLURM_HOST", None, "login node to submit through SSH (unset: submit from this machine)"),
    "user": ("MLMCLM_SLURM_USER", None, "SSH user for `host`"),
}


def _setting(name: str, value):
    if value is not None:
        return value
    env, default, _ = SETTINGS[name]
    return os.environ.get(env, default)


def settings() -> str:
    return "\n".join(f"  {env:<28} {name:<16} {help}" + (f" (default {default})" if default else "")
                     for name, (env, default, help) in SETTINGS.items())


def local_executor(processes: int = 2, gpus: bool = False, env: dict[str, str] | None = None) -> run.LocalExecutor:
    """torchrun with `processes` ranks on this machine: CPU processes (gloo) or one rank per local GPU."""
    if processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    env_vars = {
        # torchx starts `torchrun` by name: use the one of the interpreter launching us (a venv's bin is often
        # not on PATH).
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "TOKENIZERS_PARALLELISM": "false",
        **({} if gpus else {"CUDA_VISIBLE_DEVICES": ""}),  # CPU runs must not grab a GPU that happens to exist
        **(env or {}),
    }
    return run.LocalExecutor(ntasks_per_node=processes, launcher="torchrun", env_vars=env_vars)


# NCCL / torch settings for multi-node H100 over InfiniBand, each with why.
SLURM_ENV = {
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",  # megatron orders TP/SP communication before compute on one queue
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",  # a hung collective fails the job (then Slurm resubmits/resumes)
    "NCCL_IB_TIMEOUT": "22",  # tolerate transient IB fabric hiccups at scale instead of aborting
    "NCCL_DEBUG": "WARN",
    "TOKENIZERS_PARALLELISM": "false",
    # torchrun forwards SIGUSR1 (Slurm's `--signal=USR1@120`) to the ranks, which save and exit, and waits for
    # them up to 110 s (inside the 120 s notice) before killing them.
    "PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
    "PET_SHUTDOWN_TIMEOUT": "110",
    # From NVIDIA's Megatron-Bridge / NeMo 2 performance recipes (their per-job env for Hopper LLM training):
    "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",  # free NCCL buffers by stream sync, not recordStream (less memory held)
    "NCCL_NVLS_ENABLE": "0",  # NVLink SHARP off: its buffers cost GPU memory, and dense models gain little
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",  # less fragmentation with varying activation shapes
}


def slurm_executor(
    nodes: int,
    gpus_per_node: int = 8,
    account: str | None = None,
    partition: str | None = None,
    time: str | None = None,
    container_image: str | None = None,
    cpus_per_task: int | None = None,
    data_dir: str | None = None,
    checkpoint_dir: str | None = None,
    job_dir: str | None = None,
    host: str | None = None,
    user: str | None = None,
    mounts: list[str] | None = None,
    env: dict[str, str] | None = None,
    exclusive: bool = True,
    preemption_notice_s: int = 120,
    package_code: bool = False,
    max_requeues: int = 3,
) -> run.SlurmExecutor:
    """Multi-node H100 via sbatch + srun + pyxis container, one torchrun per node with `gpus_per_node` ranks.

    A preempted or timed-out run saves, exits non-zero (`recipes.entry`), and the job requeues itself up to
    `max_requeues` times, resuming from its run dir. `package_code=False` runs the mlmclm installed in the image (cluster/Dockerfile); True ships this git
    checkout's HEAD with NeMo-Run's GitArchivePackager instead (for iterating without rebuilding the image).
    """
    account = _setting("account", account)
    if not account:
        raise ValueError(f"slurm_executor needs an account: pass account= / executor.account=, or export "
                         f"{SETTINGS['account'][0]}")
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"nodes and gpus_per_node must be >= 1, got {nodes} and {gpus_per_node}")
    image = container_image_for_slurm(_setting("container_image", container_image))
    cpus = int(_setting("cpus_per_task", cpus_per_task) or CPUS_PER_GPU * gpus_per_node)
    if cpus < gpus_per_node:
        raise ValueError(f"cpus_per_task {cpus} is fewer than the {gpus_per_node} ranks torchrun starts per node")
    job_dir = _setting("job_dir", job_dir) or str(Path.home() / ".nemo_run" / "slurm_jobs")
    host = _setting("host", host)
    tunnel = (run.SSHTunnel(host=host, user=_setting("user", user) or os.environ.get("USER", ""), job_dir=job_dir)
              if host else run.LocalTunnel(job_dir=job_dir))
    container_mounts = list(mounts or [])
    for name, target in (("data_dir", DATA_MOUNT_TARGET), ("checkpoint_dir", CHECKPOINT_MOUNT_TARGET)):
        source = _setting(name, data_dir if name == "data_dir" else checkpoint_dir)
        if source:
            container_mounts.append(f"{source}:{target}")
    executor = run.SlurmExecutor(
        account=account,
        partition=_setting("partition", partition),
        time=_setting("time", time),
        nodes=nodes,
        ntasks_per_node=1,  # one torchrun agent per node; it starts gpus_per_node ranks
        # Slurm gives a task 1 CPU unless told otherwise, and srun binds it there: all 8 ranks (and their loader
        # threads) would share one core. The task gets `cpus` cores and is bound to exactly those. srun repeats
        # --cpus-per-task because since Slurm 22.05 it no longer inherits sbatch's value.
        cpus_per_task=cpus,
        srun_args=[f"--cpus-per-task={cpus}", "--cpu-bind=cores"],
        gpus_per_node=gpus_per_node,
        exclusive=exclusive,  # whole nodes: NVLink/IB topology and memory are not shared with other jobs
        signal=f"USR1@{preemption_notice_s}",  # the trainer saves on SIGUSR1 and exits; resubmit resumes
        container_image=image,
        container_mounts=container_mounts,
        env_vars={**SLURM_ENV, **(env or {})},
        tunnel=tunnel,
        packager=run.GitArchivePackager() if package_code else run.Packager(),
        launcher="torchrun",
        torchrun_nproc_per_node=gpus_per_node,
        job_name_prefix="mlmclm-",
        retries=max_requeues,  # NeMo-Run's sbatch script requeues itself while SLURM_RESTART_COUNT < retries
    )
    return executor


def container_image_for_slurm(image: str | None) -> str:
    """The image the Slurm job runs in: one built from cluster/Dockerfile. Refused here, at submission, when it is
    missing or is the bare NGC image, which would fail on the nodes (no mlmclm, nemo_run or megatron-core 0.19)."""
    build = ("build cluster/Dockerfile (cluster/README.md, 'First launch') and export "
             f"{SETTINGS['container_image'][0]}=<registry>/mlmclm:<tag> or a .sqsh path (or pass "
             "executor.container_image=...)")
    if not image:
        raise ValueError(f"slurm_executor needs a container image with mlmclm installed: {build}")
    if image.startswith(BARE_NGC_PREFIX):
        raise ValueError(f"container image {image} is a bare NGC PyTorch image: it has neither mlmclm, nemo_run nor "
                         f"megatron-core 0.19, so the job would fail on the nodes; {build}")
    return image
