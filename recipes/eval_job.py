"""The evaluation as a NeMo-Run task: `tools/evaluate.py grid` over one shared output folder. On Slurm it is a job
array of `array_tasks` tasks × `gpus_per_task` GPUs, every task the same command with `--workers gpus_per_task`:
the tasks claim the grid's units from the output folder, so K tasks share the work without a plan of who runs what,
and a requeued task only takes what is left. Locally it is one such command.

The command's exit code is the agent convention (cluster/executors.py `requeue_policy`): 0 done, 75 stopped by
SIGTERM/SIGUSR1 with its claims released (requeued), 2 a refusal (never requeued), 1 a failure.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nemo_run as run

from mlmclm.path_names import check_plain_name, check_shell_word

DEVICES = ("auto", "cpu", "cuda")
REPO = Path(__file__).resolve().parents[1]
LABEL_USE = "it is a word of the job's command line and a folder of the output"



def core_flags(workers: int, device: str) -> list[str]:
    """The flags that make one command use `workers` devices (or CPU worker processes): `grid --workers N` starts a
    worker per GPU (CUDA_VISIBLE_DEVICES) or splits the cores, all taking units from the one output folder."""
    return ["--workers", str(workers), "--device", device]


@dataclass(frozen=True)
class EvalSuite:
    """Which tasks and protocol: the smoke tasks, a task file, or the paper suite (from a fetched data root)."""
    smoke: bool = False
    tasks_file: str | None = None
    data_root: str | None = None
    paper_tasks: tuple[str, ...] = ()  # --task: only these paper tasks
    lrs: tuple[float, ...] = ()
    seeds: tuple[int, ...] = ()
    max_steps: int | None = None
    batch_size: int | None = None

    def __post_init__(self):
        if self.paper_tasks and (self.smoke or self.tasks_file):
            raise ValueError("--task selects tasks of the paper suite; it does not go with --smoke/--tasks")
        if self.data_root and (self.smoke or self.tasks_file):
            raise ValueError("--data-root is the paper suite's; it does not go with --smoke/--tasks")
        for name in ("max_steps", "batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        for task in self.paper_tasks:
            check_plain_name(task, "--task", LABEL_USE)

    def paths(self) -> dict[str, str | None]:
        return {"--tasks": self.tasks_file, "--data-root": self.data_root}

    def argv(self) -> list[str]:
        out = ["--smoke"] if self.smoke else []
        out += ["--tasks", self.tasks_file] if self.tasks_file else []
        out += ["--data-root", self.data_root] if self.data_root else []
        for task in self.paper_tasks:
            out += ["--task", task]
        out += ["--lrs", *map(repr, self.lrs)] if self.lrs else []
        out += ["--seeds", *map(str, self.seeds)] if self.seeds else []
        out += ["--max-steps", str(self.max_steps)] if self.max_steps is not None else []
        out += ["--batch-size", str(self.batch_size)] if self.batch_size is not None else []
        return out


@dataclass(frozen=True)
class EvalJob:
    """One evaluation: `models` (label → Hugging Face directory, as the job sees it) on `suite` into `output`."""
    models: tuple[tuple[str, str], ...]
    output: str
    suite: EvalSuite = field(default_factory=EvalSuite)
    array_tasks: int = 1  # Slurm: the job array's size (locally: one command)
    gpus_per_task: int = 1  # GPUs (or, without GPUs, worker processes) of each task: its --workers
    device: str = "auto"

    def __post_init__(self):
        if not self.models:
            raise ValueError("no model: pass --model LABEL=HF_MODEL_DIR")
        labels = [label for label, _ in self.models]
        if len(set(labels)) != len(labels):
            raise ValueError(f"--model labels must differ, got {labels}")
        for label, _ in self.models:
            check_plain_name(label, "--model label", LABEL_USE)
        if self.array_tasks < 1 or self.gpus_per_task < 1:
            raise ValueError(f"array_tasks and gpus_per_task must be >= 1, got {self.array_tasks} and "
                             f"{self.gpus_per_task}")
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        # the sbatch script holds the command's words unquoted
        for what, path in {**{f"--model {label}": d for label, d in self.models}, "--output": self.output,
                           **self.suite.paths()}.items():
            if path is not None:
                check_shell_word(path, what)

    def paths(self) -> dict[str, str | None]:
        """Every path the job reads or writes, by the flag that names it."""
        return {**{f"--model {label}": d for label, d in self.models}, "--output": self.output,
                **self.suite.paths()}

    def grid_argv(self) -> list[str]:
        """`tools/evaluate.py grid`'s arguments for one task."""
        argv = ["grid"]
        for label, directory in self.models:
            argv += ["--model", f"{label}={directory}"]
        return argv + self.suite.argv() + ["--output", self.output] + core_flags(self.gpus_per_task, self.device)


def evaluate_script(checkout: str | Path) -> str:
    """tools/evaluate.py where the job sees the checkout (`checkout`: this one, or the image's)."""
    return f"{str(checkout).rstrip('/')}/tools/evaluate.py"


def eval_task(job: EvalJob, checkout: str | Path = REPO) -> run.Script:
    """The task NeMo-Run runs: the grid command with the job environment's Python."""
    return run.Script(path=evaluate_script(checkout), args=job.grid_argv(), entrypoint="python")


def local_eval_executor(gpus: bool) -> run.LocalExecutor:
    """This machine: the grid command as one process (its --workers start the others)."""
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "TOKENIZERS_PARALLELISM": "false", **({} if gpus else {"CUDA_VISIBLE_DEVICES": ""})}
    return run.LocalExecutor(env_vars=env)


def slurm_script_executor(gpus_per_task: int, array_tasks: int | None, options: dict | None = None
                          ) -> run.SlurmExecutor:
    """The training executor's settings (account, image or shared environment, requeue policy, USR1 notice) for
    one command per task, without torchrun, on `gpus_per_task` GPUs of one node; a job array of `array_tasks`
    tasks (None: a plain job). Tasks share nodes unless `exclusive=True` (they are sized by GPUs, not nodes)."""
    from cluster.executors import slurm_executor

    options = {"exclusive": False, **(options or {})}
    for sized in ("nodes", "gpus_per_node", "array"):
        if sized in options:
            raise ValueError(f"executor.{sized} comes from the evaluation: set its array tasks / GPUs per task")
    executor = slurm_executor(nodes=1, gpus_per_node=gpus_per_task, **options)
    executor.launcher = None
    executor.torchrun_nproc_per_node = None
    executor.array = None if array_tasks is None else f"0-{array_tasks - 1}"
    return executor


def slurm_eval_executor(job: EvalJob, options: dict | None = None) -> run.SlurmExecutor:
    """A job array of `array_tasks` tasks × `gpus_per_task` GPUs; every path of the job one the nodes reach."""
    from cluster.executors import check_reachable

    executor = slurm_script_executor(job.gpus_per_task, job.array_tasks, options)
    check_reachable(executor, job.paths())
    return executor


def job_checkout(executor) -> str:
    """Where a Slurm job finds tools/evaluate.py: the image's copy (cluster/Dockerfile), or this checkout on the
    shared filesystem (refused when the nodes could not reach it)."""
    from cluster.executors import IMAGE_CHECKOUT, SETTINGS, refuse_unreachable

    if executor.container_image:
        return IMAGE_CHECKOUT
    shared = executor.env_vars.get(SETTINGS["shared_dirs"][0], "").split(":")
    refuse_unreachable("this checkout (tools/evaluate.py)", str(REPO), shared, SETTINGS["shared_dirs"][0])
    return str(REPO)
