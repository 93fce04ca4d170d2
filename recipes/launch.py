"""From a recipe name plus `key=value` overrides to a launched (or dry-run) NeMo-Run experiment.

Overrides are of three kinds, told apart by their key:
  * a recipe parameter (`nodes=4`, `mask_ratio=0.3`, `total_steps=12000`, ...): passed to the builder, so derived
    values (micro batch, phase lengths, run dir) follow;
  * `executor.KEY=VALUE`: an argument of the executor factory (`cluster.executors`);
  * any other dotted path into the TrainConfig (`optimizer.lr=3e-4`, `phases.1.objective.mask_ratio=0.3`,
    optionally prefixed `config.`): set on the built `run.Config` tree.
The result is validated again after the overrides.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import fiddle as fdl
import nemo_run as run
from invoke.exceptions import UnexpectedExit

from mlmclm.config_io import parse_value
from mlmclm.data.manifest import MANIFEST_NAME
from mlmclm.redact import redact
from recipes import registry
from recipes.base import validate, world_size
from recipes.interrupt import LocalInterrupt, no_new_tasks
from recipes.plan import training_plan
from recipes.progress import RunProgress, checkpointed_step, finished_step

EXECUTORS = ("local", "slurm")


@dataclass
class Overrides:
    recipe: dict = field(default_factory=dict)
    executor: dict = field(default_factory=dict)
    config: list[tuple[list[str], object]] = field(default_factory=list)


def split_overrides(recipe: registry.Recipe, items: list[str]) -> Overrides:
    out = Overrides()
    params = recipe.parameters()
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not of the form key=value")
        value = parse_value(raw)
        if key.startswith("executor."):
            out.executor[key.removeprefix("executor.")] = value
        elif key in params:
            out.recipe[key] = value
        else:
            out.config.append((key.removeprefix("config.").split("."), value))
    return out


def set_config_path(config: run.Config, path: list[str], value) -> None:
    """Set `value` at a dotted path of a `run.Config` tree (list items by index)."""
    node = config
    where = []
    for part in path[:-1]:
        where.append(part)
        node = _child(node, part, ".".join(where))
    last = path[-1]
    if isinstance(node, list):
        node[_index(node, last, ".".join(path))] = value
        return
    if not isinstance(node, fdl.Buildable):
        raise ValueError(f"config override {'.'.join(path)!r}: {'.'.join(where)!r} is not a config section")
    if last not in fdl.ordered_arguments(node, include_defaults=True):
        known = sorted(fdl.ordered_arguments(node, include_defaults=True))
        raise ValueError(f"config override {'.'.join(path)!r}: {fdl.get_callable(node).__name__} has no field "
                         f"{last!r}; known: {known}")
    setattr(node, last, value)


def _index(node: list, part: str, key: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ValueError(f"config override {key!r}: {part!r} is not an index of a list of {len(node)}")
    return int(part)


def _child(node, part: str, key: str):
    if isinstance(node, list):
        return node[_index(node, part, key)]
    if isinstance(node, fdl.Buildable) and part in fdl.ordered_arguments(node, include_defaults=True):
        child = getattr(node, part)
        if isinstance(child, (fdl.Buildable, list)):
            return child
    raise ValueError(f"config override {key!r}: no config section named {part!r}")


def build(name: str, items: list[str] = (), extra_params: dict | None = None) -> tuple[run.Partial, Overrides]:
    """The recipe `name` with overrides applied and validated; also returns the executor overrides."""
    recipe = registry.get(name)
    overrides = split_overrides(recipe, list(items))
    partial = recipe.build(**{**overrides.recipe, **(extra_params or {})})
    for path, value in overrides.config:
        set_config_path(partial.config, path, value)
    validate(partial)
    return partial, overrides


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
    slurm = executor_kind == "slurm"
    console = sys.stdout  # before NeMo-Run's output is sent to `console_log`
    if not dryrun and not (tasks := unfinished(tasks, console if progress else None)):
        return None
    interrupt = LocalInterrupt(os.fdopen(os.dup(2), "w")) if not (slurm or detach or dryrun) else None
    if dryrun:
        for name, partial in tasks:
            plan = training_plan(validate(partial), world_size(partial))
            print(redact(f"=== task {name}: the training plan\n{plan}"), file=console, flush=True)
    # locally, the runs' progress from their metrics.jsonl (NeMo-Run shows only the task's status); the experiment
    # waits for its tasks when its block exits
    watching = [RunProgress(run_dir_of(partial), partial.config.total_steps, console) for _, partial in tasks] \
        if progress and not (slurm or detach or dryrun) else []
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
                previous = exp.add(partial, executor=executor, name=name,
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


def unfinished(tasks: list[tuple[str, run.Partial]], console) -> list[tuple[str, run.Partial]]:
    """The tasks with steps left to train; each finished one is named on `console` (None: not named) — its
    processes never start, so a re-run of a finished run returns at once."""
    left = []
    for name, partial in tasks:
        cfg = partial.config
        step = finished_step(run_dir_of(partial), cfg.total_steps, cfg.checkpoint.stop_at)
        if step is None:
            left.append((name, partial))
        else:
            check_finished_run_unchanged(partial)
            what = "the segment (checkpoint.stop_at)" if step < cfg.total_steps else "the run"
            if console is not None:
                print(f"{run_dir_of(partial)}: {what} already finished at step {step}; nothing to train (delete "
                      f"the directory to train again)", file=console, flush=True)
    return left


def check_finished_run_unchanged(partial: run.Partial) -> None:
    """A finished run counts as finished for this config only if a resume would accept it: the resume's own checks
    (mlmclm.train.resume_check), so a setting changed since (`seed=99`) is refused naming it, never ignored. The
    data identity is checked where the data is a local dataset (a remote run's may not be visible from here)."""
    from mlmclm.train import checkpoint as ckpt
    from mlmclm.train.resume_check import check_resume_from

    cfg = validate(partial)
    try:
        check_resume_from(cfg, ckpt.latest_checkpoint(cfg.checkpoint_dir), _local_manifest(cfg))
    except ckpt.CheckpointError as err:  # an unreadable checkpoint: a refusal like any bad input
        raise ValueError(str(err)) from None


def _local_manifest(cfg):
    """The first phase's dataset manifest when it is a local dataset (a resume checks it), else None."""
    from mlmclm.data.manifest import Manifest

    path = cfg.phase_data()[0].path
    if path is None or not _local_path(str(path)):
        return None
    manifest = Path(path) if str(path).endswith(".json") else Path(path) / MANIFEST_NAME
    return Manifest.load(path) if manifest.is_file() else None


@contextlib.contextmanager
def _interruptible(interrupt: LocalInterrupt | None):
    if interrupt is None:
        yield
        return
    with interrupt, no_new_tasks(interrupt):
        yield


def interrupted_report(failed: list[str], run_dirs: dict[str, str]) -> str:
    """After Ctrl-C: for each task that did not finish, the step it saved (or that it saved nothing new)."""
    lines = []
    for name in failed:
        state, saved = run_status(run_dirs[name]), checkpointed_step(Path(run_dirs[name]))
        if state.get("status") == "preempted":
            lines.append(f"stopping: saved step {state.get('step')} in {run_dirs[name]} — run the same command to "
                         f"resume")
        elif saved is None:
            lines.append(f"stopped: {name} had saved no checkpoint yet (nothing to resume; the same command starts "
                         f"it afresh)")
        else:
            lines.append(f"stopped: {name} stopped before saving again; its last checkpoint is step {saved} in "
                         f"{run_dirs[name]} — run the same command to resume")
    return "\n".join(lines)


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
        configs = sorted(Path(exp._exp_dir).glob(f"{job.id}/configs/*_fn_or_script"))
        env = " ".join(f"{k}={v!r}" for k, v in sorted(ex.env_vars.items()) if k != "PATH")
        print(redact(f"=== task {job.id}: will execute (NeMo-Run's local executor; nothing started by --dryrun)\n"
                     f"torchrun --nnodes 1 --nproc-per-node {ex.ntasks_per_node} -m nemo_run.core.runners.fdl_runner "
                     f"-n {job.id} {configs[0] if configs else '<task config>'}\n"
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


class TaskFailedError(RuntimeError):
    pass


class TaskPreemptedError(TaskFailedError):
    """Every failed task stopped for a preemption after saving (the ranks exit 75; NeMo-Run only sees "failed")."""


class TaskInterruptedError(TaskFailedError):
    """Ctrl-C stopped a local launch (recipes.interrupt); the message says what each task saved."""


class TaskRefusedError(TaskFailedError):
    """The trainer refused a task's input (mlmclm.train.refusals); the message is the trainer's own, once."""


def status_stamp(run_dir: str) -> tuple[int, int] | None:
    """When and how long RUN/run_status.json was last written (None if absent): a status written by this launch
    is told from one an earlier attempt left."""
    from mlmclm.train.pretrain import STATUS_FILE

    try:
        info = (Path(run_dir) / STATUS_FILE).stat()
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


def refusals(failed: list[str], run_dirs: dict[str, str], stamps_before: dict, exp_dir: str | Path | None) -> str:
    """One line per failed task the trainer refused: its run_status.json's `refused` message written by this
    launch, else the refusal a rank printed (a run directory another run holds: its status is that run's).
    Empty when none was refused. `exp_dir`: where the local tasks' rank logs are (None: not searched)."""
    lines = []
    for name in failed:
        state = run_status(run_dirs[name])
        fresh = status_stamp(run_dirs[name]) != stamps_before.get(name)
        message = state.get("detail") if fresh and state.get("status") == "refused" else None
        if message is None and exp_dir is not None:
            message = logged_refusal(exp_dir, name)
        if message:
            lines.append(f"task {name} refused: {message}")
    return "\n".join(lines)


def logged_refusal(exp_dir: str | Path, task: str) -> str | None:
    """The refusal a rank of the task's latest attempt printed (recipes.entry), if any."""
    from mlmclm.train.refusals import REFUSAL_MARK

    attempts = sorted((Path(exp_dir) / task).rglob("attempt_*"), key=lambda p: p.stat().st_mtime)
    for path in sorted(attempts[-1].glob("*/stderr.log")) if attempts else []:
        for line in _RANK_PREFIX.sub("", path.read_text(errors="replace")).splitlines():
            if line.startswith(REFUSAL_MARK):
                return line.removeprefix(REFUSAL_MARK)
    return None


def preemption_report(failed: list[str], run_dirs: dict[str, str]) -> str | None:
    """When every failed task stopped for a preemption after saving, say so (else None: a real failure)."""
    states = {name: run_status(run_dirs[name]) for name in failed}
    if not failed or any(state.get("status") != "preempted" for state in states.values()):
        return None
    return "\n".join(f"task {name}: PREEMPTED at step {state.get('step')}, checkpoint saved in {run_dirs[name]}; run "
                     f"the same command again to resume" for name, state in states.items())


def run_status(run_dir: str) -> dict:
    """What the run's rank 0 last wrote to RUN/run_status.json ({} if nothing, or not a local path)."""
    from mlmclm.train.pretrain import STATUS_FILE

    path = Path(run_dir) / STATUS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


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


_ROOT_CAUSE_RANK = re.compile(r"Root Cause.*?\brank\s*:\s*(\d+)", re.S)
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:", re.M)


def task_error(exp_dir: str | Path, task: str, lines: int = 12) -> list[str]:
    """The last lines of a failed task's own error: the root-cause rank's stderr from torchrun's latest attempt
    (else any rank's that shows an error), else the task's combined log."""
    task_dir = Path(exp_dir) / task
    combined = sorted(task_dir.rglob("combined.log"), key=lambda p: p.stat().st_mtime)
    combined_text = combined[-1].read_text(errors="replace") if combined else ""
    attempts = sorted(task_dir.rglob("attempt_*"), key=lambda p: p.stat().st_mtime)
    candidates = []
    if attempts:
        ranks = sorted(attempts[-1].glob("*/stderr.log"), key=lambda p: p.parent.name)
        cause = _ROOT_CAUSE_RANK.search(combined_text)
        candidates = [p for p in ranks if cause and p.parent.name == cause.group(1)] + ranks
    for path in candidates:
        text = _RANK_PREFIX.sub("", path.read_text(errors="replace")).rstrip()
        if "Error" in text or "Traceback" in text:
            return [f"({path})"] + text.splitlines()[-lines:]
    if combined_text:
        return [f"({combined[-1]})"] + combined_text.rstrip().splitlines()[-lines:]
    return [f"(no task log found under {task_dir})"]


def _local_path(path: str) -> bool:
    return "://" not in path and not path.startswith("pipe:")


def prepare_local_data(names: list[str], partials: list[run.Partial], prepare: bool = False) -> None:
    """Check, before a local launch, that every task's data path holds a dataset (its manifest.json).

    The tiny recipes pack the embedded corpus when asked to: at their own default path, or anywhere with
    `prepare=True` (`--prepare-data`). Nowhere else is data invented, and a non-empty directory that is not a
    dataset is refused, never written into.
    """
    for name, partial in zip(names, partials):
        recipe = registry.get(name)
        path = str(partial.config.data.path)
        if not _local_path(path) or (Path(path) / MANIFEST_NAME).exists():
            continue
        default = recipe.parameters().get("data_path")
        at_default = isinstance(default, str) and Path(default).resolve() == Path(path).resolve()
        if recipe.prepare is not None and (prepare or at_default):
            recipe.prepare(path)
            continue
        raise ValueError(f"{name}: {not_a_dataset(path)}" + ("; pass --prepare-data to pack the embedded corpus there"
                         if recipe.prepare is not None and not Path(path).is_file() and not _non_empty(path) else "")
                         + " (or prepare a dataset with tools/prepare_data.py)")


def _non_empty(path: str | Path) -> bool:
    return Path(path).is_dir() and any(Path(path).iterdir())


def not_a_dataset(path: str | Path) -> str:
    """Why `path` (which has no manifest) is not a dataset, in words."""
    path = Path(path)
    if not path.exists():
        return f"data_path {path} does not exist"
    if not path.is_dir():
        return f"data_path {path} is a file, not a dataset directory"
    if _non_empty(path):
        return (f"data_path {path} is a non-empty directory that is not a dataset (no {MANIFEST_NAME}); refusing to "
                f"write into it")
    return f"data_path {path} is an empty directory (no {MANIFEST_NAME})"
