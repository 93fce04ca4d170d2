"""A built recipe (recipes.overrides) to a launched (or dry-run) NeMo-Run experiment: executors sized by the recipe,
chains of tasks, the local runs' progress, Ctrl-C, Slurm submission and following, and what the console says when a
task does not succeed (recipes.task_outcome). The names other modules and tests use from the launcher are importable
from here.
"""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import nemo_run as run
from invoke.exceptions import UnexpectedExit

from mlmclm.path_names import check_plain_name
from mlmclm.redact import redact
from recipes import registry
from recipes.base import validate, world_size
from recipes.data_check import not_a_dataset, prepare_local_data  # noqa: F401  (the launcher's API)
from recipes.finished_runs import check_finished_run_unchanged, unfinished  # noqa: F401
from recipes.interrupt import LocalInterrupt, no_new_tasks
from recipes.overrides import Overrides, build, set_config_path, split_overrides  # noqa: F401
from recipes.plan import training_plan
from recipes.progress import RunProgress
from recipes.rank_task import as_launched
from recipes.task_outcome import (TaskFailedError, TaskInterruptedError, TaskPreemptedError,  # noqa: F401
                                  TaskRefusedError, interrupted_report, preemption_report, refusals, run_status,
                                  status_stamp, task_error)

EXECUTORS = ("local", "slurm")


# NeMo-Run makes the experiment's folder from its title and each task's from its name, with `mkdir -p {path}` through
# a shell, and its sbatch script holds them unquoted (`mkdir`, `export PATH`, `srun` lines): a `$( )` or a space
# there would run or split on the submitting machine and on the cluster.
NAME_USE = "it names NeMo-Run's folders and is a word of its shell commands and sbatch script"


def check_experiment_names(title: str, task_names: list[str], what: str = "experiment title") -> None:
    """Refuse (ValueError, one line) a title or task name that is not a plain name, before NeMo-Run sees it."""
    check_plain_name(title, what, NAME_USE)
    for name in task_names:
        check_plain_name(name, "task name", NAME_USE)


def make_executor(kind: str, partial: run.Partial, options: dict | None = None):
    """An executor sized by the recipe itself (its nodes × gpus_per_node), so the two cannot disagree."""
    from cluster.executors import local_executor, slurm_executor

    options = dict(options or {})
    for sized in ("nodes", "gpus_per_node", "processes"):
        if sized in options:
            raise ValueError(f"executor.{sized} comes from the recipe: set `nodes=`/`gpus_per_node=` (or "
                             f"`processes=` for tiny recipes) on the recipe instead")
    if kind == "local":
        if partial.nodes != 1:
            raise ValueError(f"the local executor runs one node, but the recipe is sized for {partial.nodes} nodes "
                             f"(pass nodes=1)")
        if "gpus" not in options:
            import torch

            options["gpus"] = torch.cuda.is_available()
        return local_executor(processes=partial.gpus_per_node, **options)
    if kind == "slurm":
        from cluster.executors import check_reachable

        executor = slurm_executor(nodes=partial.nodes, gpus_per_node=partial.gpus_per_node, **options)
        check_reachable(executor, job_paths(partial))
        return executor
    raise ValueError(f"unknown executor {kind!r}; choose one of {EXECUTORS}")


def job_paths(partial: run.Partial) -> dict[str, str | None]:
    """The paths the job reads or writes, by the name a user sets them with."""
    config = partial.config
    checkpoint = getattr(config, "checkpoint", None)
    return {"data_path": config.data.path, "run_dir": config.run_dir,
            "checkpoint.init_from": getattr(checkpoint, "init_from", None),
            "checkpoint.branch_from": getattr(checkpoint, "branch_from", None)}


def run_dir_of(partial: run.Partial) -> str:
    return partial.config.run_dir


def chain(clm: run.Partial, then: run.Partial) -> run.Partial:
    """Make `then` start from `clm`'s final checkpoint (`checkpoint.init_from` = the CLM run dir)."""
    clm_cfg, then_cfg = validate(clm), validate(then)
    if clm_cfg.model.to_dict() != then_cfg.model.to_dict():
        raise ValueError(f"chain: the second task's model ({then_cfg.model.name}) differs from the first's "
                         f"({clm_cfg.model.name}); weights cannot be carried over")
    if Path(clm_cfg.run_dir).resolve() == Path(then_cfg.run_dir).resolve():
        raise ValueError("chain: both tasks use the same run_dir; the second would resume the first")
    then.config.checkpoint.init_from = clm_cfg.run_dir
    return then


def init_from_param(name: str, first: run.Partial) -> dict:
    """For a second recipe that takes `init_from` (cpt_*, tiny_mlm): the first run's directory."""
    return {"init_from": run_dir_of(first)} if "init_from" in registry.get(name).parameters() else {}


def launch(tasks: list[tuple[str, run.Partial]], executor_kind: str, executor_options: dict | None = None,
           title: str | None = None, dryrun: bool = False, detach: bool = False,
           base_dir: str | None = None, console_log: str | Path | None = None, progress: bool = True
           ) -> run.Experiment | None:
    """Run `tasks` as one `run.Experiment`, each task depending on the previous one (a chain when > 1).

    On Slurm the dependency is `afterok`: the next job starts only if the previous one finished (a preempted run
    exits non-zero and requeues itself first). Locally, tasks run one after the other.
    `dryrun` writes the scripts (sbatch for Slurm) under the experiment directory without submitting.
    `console_log`: NeMo-Run's own console output (banners, status, hints) goes to this file instead.
    Locally each run's progress is printed (`recipes.progress`) unless `progress` is False.
    A task that did not succeed raises `TaskFailedError` carrying the last lines of its own log; one the trainer
    refused (mlmclm.train.refusals: an incompatible resume, bad data) raises `TaskRefusedError` with its message.
    A finished run (or segment) is not launched — None when every task has finished, before any process starts —
    after the checks a resume makes: a finished run re-launched with a changed setting is refused naming it.
    Locally, Ctrl-C stops the runs as a preemption does (`recipes.interrupt`): `TaskInterruptedError` then says
    which step each saved.
    """
    title = title or tasks[0][0]
    check_experiment_names(title, [name for name, _ in tasks])
    slurm = executor_kind == "slurm"
    console = sys.stdout  # before NeMo-Run's output is sent to `console_log`
    label = (lambda name: f"[{name}] ") if len(tasks) > 1 else (lambda name: "")  # whose line is whose (a detour)
    if not dryrun and not (tasks := unfinished(tasks, console if progress else None)):
        return None
    interrupt = LocalInterrupt(os.fdopen(os.dup(2), "w")) if not (slurm or detach or dryrun) else None
    if dryrun:
        for name, partial in tasks:
            plan = training_plan(validate(partial), world_size(partial))
            print(redact(f"=== task {name}: the training plan\n{plan}"), file=console, flush=True)
    # locally, the runs' progress from their metrics.jsonl (NeMo-Run shows only the task's status); the experiment
    # waits for its tasks when its block exits
    watching = [RunProgress(run_dir_of(partial), partial.config.total_steps, console, prefix=label(name))
                for name, partial in tasks] if progress and not (slurm or detach or dryrun) else []
    with _console_to(console_log), _watched(watching), _interruptible(interrupt):
        # Slurm: submitted detached and followed with scontrol (NeMo-Run's own wait and status need sacct).
        # NeMo-Run's status table and its "reconstruct this experiment" hints (~20 lines) are left out: the progress
        # lines, the task's outcome and the experiment directory printed here say what a user needs.
        # Locally, on the user's terminal, NeMo-Run's banners and its live status panel (~8 lines around the
        # progress lines, its box glued to the next line) are left out too (clean_mode): RunProgress says more.
        quiet_console = console_log is None and not (slurm or dryrun or detach)
        with run.Experiment(title, base_dir=base_dir, log_level="WARN", skip_status_at_exit=True,
                            enable_goodbye_message=False, clean_mode=quiet_console) as exp:
            previous = None
            for name, partial in tasks:
                executor = make_executor(executor_kind, partial, executor_options)
                previous = exp.add(as_launched(partial), executor=executor, name=name,
                                   dependencies=[previous] if previous else None)
            statuses_before = {name: status_stamp(run_dir_of(partial)) for name, partial in tasks}
            if dryrun:  # NeMo-Run's own dump (an 80-column torchx structure) is replaced by print_local_dryrun
                exp.dryrun(log=False, delete_exp_dir=False)
            else:
                try:
                    exp.run(detach=detach or slurm, tail_logs=False)
                except UnexpectedExit as err:  # sbatch (through NeMo-Run's tunnel) refused the script
                    raise TaskFailedError(f"submission failed: {err.result.command}: "
                                          f"{(err.result.stderr or err.result.stdout).strip()}") from None
        if dryrun and not slurm:
            print_local_dryrun(exp, console)
            return exp
        if slurm:
            if dryrun:
                print_slurm_dryrun(exp)
                return exp
            jobs, statuses = follow_slurm(exp, detach)
            if detach:
                return exp
        else:
            statuses = {} if dryrun or detach else exp.status(return_dict=True)
    failed = {name: str(info["status"]) for name, info in statuses.items() if str(info["status"]) != "SUCCEEDED"}
    if failed and interrupt is not None and interrupt.requested:
        raise TaskInterruptedError(interrupted_report(list(failed), {n: run_dir_of(p) for n, p in tasks}))
    if failed:
        if message := preemption_report(list(failed), {name: run_dir_of(partial) for name, partial in tasks}):
            raise TaskPreemptedError(message)
        if refused := refusals(list(failed), {name: run_dir_of(partial) for name, partial in tasks},
                               statuses_before, None if slurm else exp._exp_dir):
            raise TaskRefusedError(refused)
        if slurm:
            from cluster.slurm_jobs import error_lines

            errors = {name: error_lines(exp._exp_dir, jobs[name]) for name in failed}
        else:
            errors = {name: task_error(exp._exp_dir, name) for name in failed}
        for name in failed:  # a checkpoint the filesystem refused: the trainer's own account, not a rank's log tail
            state = run_status(run_dir_of(dict(tasks)[name]))
            if state.get("status") == "save_failed":
                errors[name] = [state.get("detail", "")]
        reports = [f"task {name}: {status}\n" + "\n".join("    " + line for line in errors[name])
                   for name, status in failed.items()]
        raise TaskFailedError(f"experiment {exp._id}: task(s) did not succeed; logs under {exp._exp_dir}\n"
                              + "\n".join(reports))
    return exp


@contextlib.contextmanager
def _interruptible(interrupt: LocalInterrupt | None):
    if interrupt is None:
        yield
        return
    with interrupt, no_new_tasks(interrupt):
        yield


def slurm_jobs(exp: run.Experiment) -> dict[str, str]:
    """Task name → Slurm job id of a launched experiment."""
    from cluster.slurm_jobs import job_id_of

    return {job.id: job_id_of(job.handle) for job in exp.jobs}


def follow_slurm(exp: run.Experiment, detach: bool) -> tuple[dict[str, str], dict[str, dict]]:
    """Print the job ids of a submitted experiment; unless `detach`, wait for them (printing each change of state)
    and return task name → {"status": "SUCCEEDED" or Slurm's final state}."""
    from cluster.slurm_jobs import wait_for_jobs

    jobs = slurm_jobs(exp)
    print("submitted: " + ", ".join(f"{name} = Slurm job {job_id}" for name, job_id in jobs.items())
          + f"; logs under {exp._exp_dir}", flush=True)
    print(f"follow them: squeue -j {','.join(jobs.values())}; tail -F {exp._exp_dir}/*/log-*.out "
          f"(one log per start of a job; a requeued job adds the next)", flush=True)
    if detach:
        return jobs, {}
    states = wait_for_jobs(jobs, log=lambda line: print(line, flush=True))
    return jobs, {name: {"status": "SUCCEEDED" if s.state == "COMPLETED" else s.describe()}
                  for name, s in states.items()}


def print_local_dryrun(exp: run.Experiment, console) -> None:
    """For each task: the torchrun command NeMo-Run's local executor will run, with the environment it adds."""
    for job in exp.jobs:
        ex = job.executor
        script = Path(exp._exp_dir) / job.id / "scripts" / f"{job.id}.sh"
        env = " ".join(f"{k}={v!r}" for k, v in sorted(ex.env_vars.items()) if k != "PATH")
        print(redact(f"=== task {job.id}: will execute (NeMo-Run's local executor; nothing started by --dryrun)\n"
                     f"torchrun --nnodes 1 --nproc-per-node {ex.ntasks_per_node} --no-python "
                     f"{script if script.exists() else '<task script>'}  (each rank: python -m recipes.rank, "
                     f"the task in the script)\n"
                     f"environment added: {env} (and this Python's bin first on PATH); logs under {exp._exp_dir}"),
              file=console, flush=True)


def print_slurm_dryrun(exp: run.Experiment) -> None:
    """For each task: the mode (container or bare-metal), what it asks Slurm for, and its sbatch script verbatim
    (plain print, so nothing is wrapped and it can be copied)."""
    from cluster.executors import launch_mode

    for job in exp.jobs:
        ex = job.executor
        scripts = sorted(Path(exp._exp_dir).rglob(f"{ex.job_name}_sbatch.sh")) or sorted(
            Path(exp._exp_dir).rglob("*_sbatch.sh"))
        gpus = f"{ex.gpus_per_node} GPUs each = {ex.nodes * ex.gpus_per_node} GPUs" if ex.gpus_per_node else "no GPUs"
        print(f"=== task {job.id}: {launch_mode(ex)}\n"
              f"asks Slurm for {ex.nodes} node(s) {'(whole, --exclusive) ' if ex.exclusive else ''}× {gpus}, "
              f"{ex.cpus_per_task} CPUs per node, wall time {ex.time} per job (requeued until done); ask for less "
              f"with the recipe's nodes=, executor.time=, executor.cpus_per_task=\n"
              f"sbatch script ({scripts[0] if scripts else 'not written'}):")
        if scripts:   # credentials shown as <redacted>: the script on disk holds them (the job needs them)
            text = redact(scripts[0].read_text())
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
        sys.stdout.flush()


@contextlib.contextmanager
def _watched(reporters: list[RunProgress]):
    for reporter in reporters:
        reporter.start()
    try:
        yield
    finally:
        for reporter in reporters:
            reporter.stop()


@contextlib.contextmanager
def _console_to(path: str | Path | None):
    """Send this process's stdout/stderr (file descriptors, so rich's console and child processes too) to `path`."""
    if path is None:
        yield
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush(), sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a", encoding="utf-8") as log:
        os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])
