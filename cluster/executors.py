"""NeMo-Run executors: local torchrun (CPU or one node's GPUs) and Slurm multi-node H100, in a pyxis container or
bare-metal (a Python environment on a shared filesystem).

Everything site-specific is an argument with a default read from `MLMCLM_*` environment variables, so a cluster
is configured by exporting a few variables (or passing `executor.KEY=VALUE` to `python -m recipes`), never by
editing code. `settings()` lists them.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import nemo_run as run

from mlmclm.path_names import check_shell_word

# The NGC PyTorch image cluster/Dockerfile builds on (CUDA, NCCL, Transformer Engine and apex built against its
# torch). It is not a runnable default: it has neither mlmclm, nemo_run nor megatron-core 0.19, so a job on it fails
# on the nodes. The image to run is the one built from cluster/Dockerfile (MLMCLM_CONTAINER_IMAGE).
BASE_IMAGE = "nvcr.io/nvidia/pytorch:26.06-py3"
BARE_NGC_PREFIX = "nvcr.io/nvidia/pytorch:"
CPUS_PER_GPU = 8  # default CPU cores per GPU rank for the node's torchrun task (data loading, host-side work)
DATA_MOUNT_TARGET, CHECKPOINT_MOUNT_TARGET = "/data", "/checkpoints"  # the paper recipes' default paths
IMAGE_CHECKOUT = "/opt/mlmclm"  # cluster/Dockerfile's WORKDIR: tools/ (evaluate.py, convert_to_hf.py) in the image

# name -> (environment variable, default, help)
SETTINGS: dict[str, tuple[str, str | None, str]] = {
    "account": ("MLMCLM_SLURM_ACCOUNT", None, "Slurm account (required)"),
    "partition": ("MLMCLM_SLURM_PARTITION", None, "Slurm partition"),
    "time": ("MLMCLM_SLURM_TIME", "04:00:00", "wall-clock limit per job; resume continues after it"),
    "container_image": ("MLMCLM_CONTAINER_IMAGE", None,
                        "pyxis/enroot image built from cluster/Dockerfile (squashfs path or registry); unset: "
                        "bare-metal, the job runs python_env from shared_dirs"),
    "python_env": ("MLMCLM_PYTHON_ENV", None,
                   "bare-metal: the venv or conda prefix the job runs (default: the one launching)"),
    "shared_dirs": ("MLMCLM_SHARED_DIRS", None,
                    "bare-metal: ':'-separated directories every node sees (env, data, run dirs, job_dir)"),
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
    python_env: str | None = None,
    shared_dirs: str | list[str] | None = None,
    cpus_per_task: int | None = None,
    data_dir: str | None = None,
    checkpoint_dir: str | None = None,
    job_dir: str | None = None,
    host: str | None = None,
    user: str | None = None,
    mounts: list[str] | None = None,
    env: dict[str, str] | None = None,
    exclusive: bool = True,
    gpus: bool = True,
    preemption_notice_s: int = 120,
    package_code: bool = False,
    max_requeues: int = 3,
    rdzv_port: int = 29500,
) -> run.SlurmExecutor:
    """sbatch + srun, one torchrun per node with `gpus_per_node` ranks; in a pyxis container when an image is set,
    else bare-metal: the job runs `python_env` (default: this interpreter's environment) from `shared_dirs`.

    A preempted or timed-out run saves and exits 75; the job requeues itself and resumes from its run dir (see
    `requeue_policy`). `gpus=False` asks for no GPUs and hides them (CPU ranks over gloo, as tests run).
    `package_code=False` runs the mlmclm installed in the image or environment; True ships this git checkout's HEAD
    with NeMo-Run's GitArchivePackager instead (for iterating without rebuilding the image).
    """
    account = _setting("account", account)
    if not account:
        raise ValueError(f"slurm_executor needs an account: pass account= / executor.account=, or export "
                         f"{SETTINGS['account'][0]}")
    if nodes < 1 or gpus_per_node < 1:
        raise ValueError(f"nodes and gpus_per_node must be >= 1, got {nodes} and {gpus_per_node}")
    if max_requeues < 0:
        raise ValueError(f"max_requeues must be >= 0, got {max_requeues}")
    cpus = int(_setting("cpus_per_task", cpus_per_task) or CPUS_PER_GPU * gpus_per_node)
    if cpus < gpus_per_node:
        raise ValueError(f"cpus_per_task {cpus} is fewer than the {gpus_per_node} ranks torchrun starts per node")
    # job_dir, the image, the mounts, python_env and shared_dirs are words of NeMo-Run's `mkdir -p` and of the sbatch
    # script, unquoted: each is refused unless it stays one inert word
    job_dir = check_shell_word(_setting("job_dir", job_dir) or str(Path.home() / ".nemo_run" / "slurm_jobs"),
                               "job_dir")
    host = _setting("host", host)
    tunnel = (run.SSHTunnel(host=host, user=_setting("user", user) or os.environ.get("USER", ""), job_dir=job_dir)
              if host else run.LocalTunnel(job_dir=job_dir))
    if preemption_notice_s < 1:
        raise ValueError(f"preemption_notice_s must be >= 1, got {preemption_notice_s}")
    # CPU ranks share the task's cores: as many threads each as they have cores (torchrun sets 1 only when it starts
    # several ranks per node; a 2-node x 1-rank run would otherwise differ from the same run on one node)
    cpu_ranks = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(max(1, cpus // gpus_per_node))}
    env_vars = {**SLURM_ENV, **({} if gpus else cpu_ranks),
                # torchrun's wait for the ranks' save stays inside the notice
                "PET_SHUTDOWN_TIMEOUT": str(max(1, preemption_notice_s - 10))}
    image = _setting("container_image", container_image)
    setup = [requeue_policy(max_requeues)]
    container_mounts = [check_shell_word(mount, "mounts") for mount in mounts or []]
    if image:
        image = check_shell_word(container_image_for_slurm(image), "container_image")
        for name, target in (("data_dir", DATA_MOUNT_TARGET), ("checkpoint_dir", CHECKPOINT_MOUNT_TARGET)):
            source = _setting(name, data_dir if name == "data_dir" else checkpoint_dir)
            if source:
                container_mounts.append(f"{check_shell_word(source, name)}:{target}")
    else:
        shared = shared_directories(_setting("shared_dirs", shared_dirs))
        prefix = bare_metal_env(_setting("python_env", python_env), shared, check_local=not host)
        given = [name for name, value in (("data_dir", _setting("data_dir", data_dir)),
                                          ("checkpoint_dir", _setting("checkpoint_dir", checkpoint_dir)),
                                          ("mounts", container_mounts)) if value]
        if given:
            raise ValueError(f"{', '.join(given)} mount host directories into a container, but no container image is "
                             f"set (bare-metal: the job reads and writes host paths): set data_path= and run_dir= "
                             f"on the recipe instead, under {SETTINGS['shared_dirs'][0]}, or set "
                             f"{SETTINGS['container_image'][0]}")
        refuse_unreachable("job_dir", job_dir, shared, SETTINGS["shared_dirs"][0],
                           hint=f", or set {SETTINGS['job_dir'][0]} to a directory there")
        for what, path in (("job_dir", job_dir), ("python_env", prefix), ("shared_dirs", ":".join(shared))):
            if "/nemo_run" in path:  # NeMo-Run rewrites every "/nemo_run" of a container-less sbatch script
                raise ValueError(f"{what} {path} contains '/nemo_run', which NeMo-Run replaces with the job folder "
                                 f"in a script without a container (so the job would look elsewhere); rename it")
        for what, path in (("python_env", prefix), *(("shared_dirs", d) for d in shared)):
            check_shell_word(path, what)
        env_vars.update({"PATH": f"{prefix}/bin:$PATH", SETTINGS["shared_dirs"][0]: ":".join(shared),
                         "VIRTUAL_ENV": prefix})
        setup.append(torchrun_shim(prefix))
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
        # --kill-on-bad-exit=0 (NeMo-Run sets 1): after a preemption the first node's agent exits 75, and srun would
        # then kill the other nodes' agents while they finish (the job's exit: 143, a failure, measured on a
        # two-node local Slurm); srun's --wait=60 still ends the others 60 s after a first task exits.
        srun_args=[f"--cpus-per-task={cpus}", "--cpu-bind=cores", "--kill-on-bad-exit=0"],
        gpus_per_node=gpus_per_node if gpus else None,
        exclusive=exclusive or None,  # whole nodes: NVLink/IB topology and memory are not shared with other jobs
        # no `B:`: Slurm signals every process of the job step (agent, ranks, their helpers), each saves or ignores
        signal=f"USR1@{preemption_notice_s}",
        container_image=image or None,
        container_mounts=container_mounts,
        env_vars={**env_vars, **(env or {})},
        setup_lines="\n".join(setup),
        tunnel=tunnel,
        packager=run.GitArchivePackager() if package_code else run.Packager(),
        # torchrun's rendezvous on the first node; jobs sharing a host (a test cluster) need distinct ports
        launcher=run.Torchrun(rdzv_port=rdzv_port),
        torchrun_nproc_per_node=gpus_per_node,
        job_name_prefix="mlmclm-",
        # the script's own requeue test (TORCHX_MAX_RETRIES > SLURM_RESTART_COUNT) is lifted; requeue_policy decides
        retries=max_requeues,
    )
    return executor


def requeue_policy(max_requeues: int) -> str:
    """Shell lines for the top of NeMo-Run's sbatch script. Its last lines run `scontrol requeue` on any non-zero
    exit while TORCHX_MAX_RETRIES > SLURM_RESTART_COUNT; here that call decides instead: a run that stopped after
    its preemption save (exit 75) is always requeued (it made progress and resumes where it stopped); a run whose
    ranks refused their input (exit 2: an incompatible resume, a bad config, bad data — mlmclm.train.refusals, passed
    on by mlmclm.parallel.torchrun) never is, since it would be refused again; any other failure only while the job
    has been restarted fewer than `max_requeues` times (a crash or node failure resumes from the last periodic
    checkpoint). The evaluation's grid command (recipes/eval_job.py) keeps the same codes: 75 after a stop that
    gave its units back, 2 for a refusal."""
    return f"""# mlmclm requeue policy (cluster/executors.py requeue_policy)
export TORCHX_MAX_RETRIES=1000000 MLMCLM_MAX_REQUEUES={max_requeues}
scontrol() {{
    local restarts=${{SLURM_RESTART_COUNT:-0}}
    if [ "$1" = requeue ]; then
        if [ "$exitcode" = 75 ]; then
            echo "mlmclm: preempted after saving (exit 75): requeued, the run resumes from its checkpoint"
        elif [ "$exitcode" = 2 ]; then
            echo "mlmclm: refused its input (exit 2): not requeued, it would be refused again (the reason is" \\
                "in the task's log; a training run's also in its run_status.json)" >&2
            return 0
        elif [ "$restarts" -lt "$MLMCLM_MAX_REQUEUES" ]; then
            echo "mlmclm: failed (exit $exitcode): requeued (restart $((restarts + 1)) of $MLMCLM_MAX_REQUEUES)"
        else
            echo "mlmclm: failed (exit $exitcode) after $restarts restart(s): not requeued" \\
                "(max_requeues=$MLMCLM_MAX_REQUEUES)" >&2
            return 0
        fi
    fi
    command scontrol "$@"
}}"""


def torchrun_shim(prefix: str) -> str:
    """NeMo-Run's srun line starts `torchrun` by name; this puts first on PATH one that is
    `python -m mlmclm.parallel.torchrun` (torchrun that keeps waiting for the ranks' save after Slurm's signal and
    exits 75 when they stopped that way). `/nemo_run` is NeMo-Run's job folder (on the shared filesystem): NeMo-Run
    replaces it with the real path in a script without a container."""
    return (f"# `torchrun` = python -m mlmclm.parallel.torchrun (exit 75 after a preemption save)\n"
            f"mkdir -p /nemo_run/bin && printf '%s\\n' '#!/bin/sh' "
            f"'exec {prefix}/bin/python -m mlmclm.parallel.torchrun \"$@\"' > /nemo_run/bin/torchrun "
            f"&& chmod +x /nemo_run/bin/torchrun\n"
            f"export PATH=/nemo_run/bin:$PATH")


def shared_directories(value: str | list[str] | None) -> list[str]:
    """The directories every node sees, absolute and normalised; bare-metal launches need them."""
    if not value:
        raise ValueError(
            "no container image is set, so the job runs bare-metal: this Python environment on the nodes, which "
            "must see it, the data and the run directories on a shared filesystem. Say which directories every node "
            f"sees: export {SETTINGS['shared_dirs'][0]}=/lustre:/home (or executor.shared_dirs=...); for a pyxis "
            f"cluster set {SETTINGS['container_image'][0]} instead (cluster/README.md)")
    items = value.split(":") if isinstance(value, str) else list(value)
    dirs = [os.path.normpath(d) for d in items if d]
    relative = [d for d in dirs if not os.path.isabs(d)]
    if relative:
        raise ValueError(f"{SETTINGS['shared_dirs'][0]}: {relative} are not absolute paths")
    return dirs


def bare_metal_env(python_env: str | None, shared: list[str], check_local: bool = True) -> str:
    """The environment prefix the job runs: `python_env`, else this interpreter's; on the shared filesystem."""
    prefix = os.path.normpath(python_env or sys.prefix)
    if check_local and not Path(prefix, "bin", "python").exists():
        raise ValueError(f"python_env {prefix} has no bin/python; {SETTINGS['python_env'][0]} names a venv or conda "
                         f"prefix")
    refuse_unreachable("python_env", prefix, shared, SETTINGS["shared_dirs"][0],
                       hint=f", or name one there with {SETTINGS['python_env'][0]}")
    if python_env is None:  # this environment: an editable install imports mlmclm from a checkout outside it
        import mlmclm

        refuse_unreachable("mlmclm (imported by this environment from)", str(Path(mlmclm.__file__).parent.parent),
                           shared, SETTINGS["shared_dirs"][0])
    return prefix


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def refuse_unreachable(what: str, path: str, roots: list[str], variable: str, hint: str = "") -> None:
    path = os.path.normpath(path)
    if not os.path.isabs(path):
        raise ValueError(f"{what} {path} is relative: the job runs in NeMo-Run's job folder, not here; give an "
                         f"absolute path under {variable}={':'.join(roots)}")
    if not any(_under(path, root) for root in roots):
        raise ValueError(f"{what} {path} is not on the shared filesystem the nodes see ({variable}="
                         f"{':'.join(roots)}): the job could not reach it; move it there, or add its directory to "
                         f"{variable}{hint}")


def launch_mode(executor: run.SlurmExecutor) -> str:
    """One line: what the job runs in, and where."""
    if executor.container_image:
        return f"container mode: pyxis/enroot image {executor.container_image}, mounts {executor.container_mounts}"
    return (f"bare-metal mode (no container image): {executor.env_vars.get('VIRTUAL_ENV')} on the shared filesystem "
            f"{executor.env_vars.get(SETTINGS['shared_dirs'][0])}")


def check_reachable(executor: run.SlurmExecutor, paths: dict[str, str]) -> None:
    """Refuse, at submission, a path the job would not find: in a container, one under no mount (it would read
    nothing, or write inside the container and lose it); bare-metal, one off the shared filesystem."""
    if executor.container_image:
        targets = [m.split(":")[1] for m in executor.container_mounts if ":" in m]
        for what, path in paths.items():
            if not path:
                continue
            if not os.path.isabs(path):
                raise ValueError(f"{what} {path} is relative: in the container it would be under NeMo-Run's job "
                                 f"folder; give an absolute path under a mount")
            if any(_under(os.path.normpath(path), target) for target in targets):
                continue
            name, target = ("data_dir", DATA_MOUNT_TARGET) if what == "data_path" else \
                ("checkpoint_dir", CHECKPOINT_MOUNT_TARGET)
            outcome = "find no data there" if what == "data_path" else "write it inside the container and lose it"
            mounted = ", ".join(targets) or "nothing but NeMo-Run's own folder"
            raise ValueError(f"{what} {path} is under no container mount (mounted: {mounted}): the job would "
                             f"{outcome}; export {SETTINGS[name][0]}=<host dir> (mounted at {target}) and use a "
                             f"path under it, or add executor.mounts=[<host>:<container>]")
        return
    shared = executor.env_vars.get(SETTINGS["shared_dirs"][0], "").split(":")
    for what, path in paths.items():
        if path:
            refuse_unreachable(what, path, shared, SETTINGS["shared_dirs"][0])


def container_image_for_slurm(image: str | None) -> str:
    """The image the Slurm job runs in: one built from cluster/Dockerfile. Refused here, at submission, when it is
    the bare NGC image, which would fail on the nodes (no mlmclm, nemo_run or megatron-core 0.19)."""
    build = ("build cluster/Dockerfile (cluster/README.md, 'First launch') and export "
             f"{SETTINGS['container_image'][0]}=<registry>/mlmclm:<tag> or a .sqsh path (or pass "
             "executor.container_image=...)")
    if not image:
        raise ValueError(f"slurm_executor needs a container image with mlmclm installed: {build}")
    if image.startswith(BARE_NGC_PREFIX):
        raise ValueError(f"container image {image} is a bare NGC PyTorch image: it has neither mlmclm, nemo_run nor "
                         f"megatron-core 0.19, so the job would fail on the nodes; {build}")
    return image
