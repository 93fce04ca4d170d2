"""`python -m recipes.sweep GRID --with-eval`: after each pretraining run, its export and its evaluation, and the paper
report once every model is scored — as more tasks of the sweep's one NeMo-Run experiment.

Per run: `export-RUN` (`tools/convert_to_hf.py RUN_DIR EXPORT_ROOT/RUN --verify`) after the run's last training job,
then `eval-RUN` (`tools/evaluate.py grid --model RUN=EXPORT_ROOT/RUN ... --output EVAL_ROOT/RUN`, on Slurm a job
array) after it; then `report` (`tools/paper_report.py EVAL_ROOT/RUN ... --out REPORT_DIR --force`) after every
evaluation. On Slurm these are `afterok` dependencies; locally they run in that order, and none starts after a
task that did not succeed. A stage whose output is there and newer than its input is not run again (an export:
its config.json; an evaluation: its summary.json, written when every unit has finished; the report: report.md),
unless a stage before it runs; so a second invocation of a finished sweep starts nothing.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import nemo_run as run

from mlmclm.atomic_write import write_atomic
from mlmclm.train.checkpoint_files import LATEST_FILE
from recipes.eval_job import REPO, EvalJob, EvalSuite, eval_task, job_checkout, local_eval_executor, \
    slurm_eval_executor, slurm_script_executor
from recipes.interrupt import launches_skipped
from recipes.sweep_plan import PlannedRun, host_run_dir

EXPORT_DONE, EVAL_DONE, REPORT_DONE = "config.json", "summary.json", "report.md"
# What the sweep last asked of an evaluation folder (the grid command's arguments): a summary counts as done only
# for the same command, so another suite, seeds or budget evaluates again (finished units are still skipped).
EVAL_STAMP = "sweep_eval.json"


@dataclass(frozen=True)
class EvalChain:
    """Where the sweep's exports, evaluations and report go, and how each evaluation runs."""
    export_root: str
    eval_root: str
    report_dir: str
    suite: EvalSuite = field(default_factory=EvalSuite)
    array_tasks: int = 1
    gpus_per_task: int = 1
    device: str = "auto"

    @classmethod
    def beside(cls, run_root: str, **kwargs) -> EvalChain:
        """The default folders: siblings of the run root (`ROOT-hf`, `ROOT-eval`, `ROOT-report`)."""
        root = run_root.rstrip("/")
        return cls(f"{root}-hf", f"{root}-eval", f"{root}-report", **kwargs)

    def absolute(self) -> EvalChain:
        """Locally the tasks run in NeMo-Run's folder: the paths as this machine sees them from here."""
        path = lambda value: str(Path(value).absolute())  # noqa: E731
        return EvalChain(path(self.export_root), path(self.eval_root), path(self.report_dir), self.suite,
                         self.array_tasks, self.gpus_per_task, self.device)


@dataclass
class Stage:
    """One task of the chain: `kind` export, eval or report; it waits for the jobs named in `after`."""
    name: str
    kind: str
    after: list[str]
    output: str  # where it writes, as the job sees it
    run_dir: str | None = None  # export: the run it exports
    eval_job: EvalJob | None = None  # eval: the array's command
    inputs: list[str] = field(default_factory=list)  # report: the evaluation folders


def _newer(path: Path | None, *than: Path | None) -> bool:
    """`path` exists and is at least as new as every existing one of `than` (None: not visible from here)."""
    if path is None or not path.exists():
        return False
    mtime = path.stat().st_mtime
    return all(other is None or not other.exists() or other.stat().st_mtime <= mtime for other in than)


def chain_stages(planned: list[PlannedRun], launching: set[str], chain: EvalChain,
                 checkpoint_dir: str | None, local: bool = False) -> list[Stage]:
    """The stages still to run for `planned` (the selected runs), given the training jobs being launched (by name:
    a run's last job carries its name); a stage is run when its output is not there, older than its input, or a
    stage before it runs. Empty when the chain has nothing left to do. `local`: run directories made absolute (a
    local task runs in NeMo-Run's folder)."""
    host = lambda path: host_run_dir(path, checkpoint_dir)  # noqa: E731  where this machine sees a job's path
    stages: list[Stage] = []
    evals: list[str] = []
    summaries = []
    for p in planned:
        name = p.entry.name
        run_dir = str(Path(p.partial.config.run_dir).absolute()) if local else p.partial.config.run_dir
        export, output = f"{chain.export_root}/{name}", f"{chain.eval_root}/{name}"
        trained = name in launching
        exported = _host_file(host(export), EXPORT_DONE)
        summary = _host_file(host(output), EVAL_DONE)
        summaries.append(summary)
        latest = _host_file(host(run_dir), f"checkpoints/{LATEST_FILE}")  # rewritten by every checkpoint it saves
        export_now = trained or not _newer(exported, latest)
        if export_now:
            stages.append(Stage(f"export-{name}", "export", [name] if trained else [], export, run_dir=run_dir))
        job = EvalJob(((name, export),), output, chain.suite, chain.array_tasks, chain.gpus_per_task, chain.device)
        # the summary of this very command, written after the sweep stamped it (a failed attempt leaves it older)
        if export_now or not _newer(summary, exported, _host_file(host(output), EVAL_STAMP)) \
                or _stamped(host(output)) != job.grid_argv():
            stages.append(Stage(f"eval-{name}", "eval", [f"export-{name}"] if export_now else [], output,
                                eval_job=job))
        evals.append(output)
    report = _host_file(host(chain.report_dir), REPORT_DONE)
    waits = [s.name for s in stages if s.kind == "eval"]
    if waits or not _newer(report, *summaries):
        stages.append(Stage("report", "report", waits, chain.report_dir, inputs=evals))
    return stages


def _host_file(folder: Path | None, name: str) -> Path | None:
    return None if folder is None else folder / name


def _stamped(folder: Path | None) -> list[str] | None:
    try:
        return json.loads((folder / EVAL_STAMP).read_text(encoding="utf-8"))["argv"]
    except (TypeError, OSError, ValueError, KeyError):
        return None


def stamp_evaluations(stages: list[Stage], checkpoint_dir: str | None) -> None:
    """Record, in each evaluation folder this machine sees, the command about to run there (see EVAL_STAMP)."""
    for stage in stages:
        folder = host_run_dir(stage.output, checkpoint_dir) if stage.kind == "eval" else None
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            write_atomic(folder / EVAL_STAMP, json.dumps({"argv": stage.eval_job.grid_argv()}) + "\n")


def stage_task(stage: Stage, checkout: str) -> run.Script:
    """The command of a stage, with the tools where the job sees the checkout."""
    tools = f"{checkout.rstrip('/')}/tools"
    if stage.kind == "eval":
        return eval_task(stage.eval_job, checkout)
    if stage.kind == "export":
        # an export published after the run's last checkpoint (convert_to_hf writes the folder only when all of it
        # verified) is kept: a requeued or repeated sweep does not export again; an older one is replaced
        done, latest = f"{stage.output}/{EXPORT_DONE}", f"{stage.run_dir}/checkpoints/{LATEST_FILE}"
        return run.Script(inline=f"if [ {done} -nt {latest} ]; then echo '{stage.output}: exported after the "
                                 f"last checkpoint, kept'; exit 0; fi\n"
                                 f"exec python {tools}/convert_to_hf.py {stage.run_dir} {stage.output} --verify "
                                 f"--force\n")
    return run.Script(path=f"{tools}/paper_report.py", args=[*stage.inputs, "--out", stage.output, "--force"],
                      entrypoint="python")


def stage_executor(stage: Stage, kind: str, options: dict | None):
    """(executor, task) of a stage: the evaluation a job array of its size; the export and the report one task
    without GPUs (the export's check runs on the CPU; the report draws tables and figures)."""
    options = dict(options or {})
    if kind == "local":
        gpus = options.get("gpus")
        if gpus is None:
            import torch

            gpus = torch.cuda.is_available()
        return local_eval_executor(bool(gpus) and stage.kind == "eval"), stage_task(stage, str(REPO))
    if stage.kind == "eval":
        executor = slurm_eval_executor(stage.eval_job, options)
    else:
        from cluster.executors import check_reachable

        executor = slurm_script_executor(1, None, {**options, "gpus": False})
        check_reachable(executor, {"run_dir": stage.run_dir, "output": stage.output,
                                   **{f"input {i}": p for i, p in enumerate(stage.inputs)}})
    return executor, stage_task(stage, job_checkout(executor))


def none_after_a_failure(stage_names: set[str], progress=None):
    """Locally, NeMo-Run starts the next task of a sequence whatever became of the one before; a stage of the chain
    is not started after a task that did not succeed (or was not started): an export of a failed run, an evaluation
    of a missing export, would only fail again. `progress` (recipes.chain_progress.ChainProgress) is told of each
    launch."""
    from torchx.specs.api import AppState

    seen: list = []  # the jobs asked to launch so far, in order (locally each one has ended before the next)
    succeeded = lambda j: j.launched and j.state == AppState.SUCCEEDED  # noqa: E731

    def after_a_failure(job) -> bool:
        failed = not all(succeeded(j) for j in seen)
        previous = succeeded(seen[-1]) if seen and seen[-1].launched else None
        seen.append(job)
        skip = job.id in stage_names and failed
        if progress is not None:
            progress.launching(job.id, skip, previous)
        return skip

    return launches_skipped(after_a_failure)


def describe(stages: list[Stage]) -> str:
    """The chain's lines for the plan's output: what runs after what."""
    return "\n".join(f"{s.name}" + (f"  ← after {', '.join(s.after)}" if s.after else "") for s in stages)
