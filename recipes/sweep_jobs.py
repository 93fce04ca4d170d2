"""A plan's runs as one NeMo-Run experiment: parents of branches cut into segments that end at the branch points,
each job with the jobs it waits for (Slurm `afterok`; locally, run in that order)."""
from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass

import nemo_run as run

from recipes import launch
from recipes.chain_progress import ChainProgress
from recipes.interrupt import LocalInterrupt
from recipes.rank_task import as_launched
from recipes.sweep_plan import PlannedRun, branch_points


@dataclass
class Job:
    """One job of a launch: a run, or a segment of a parent run ending at a branch point."""
    name: str
    run: PlannedRun
    partial: run.Partial
    after: list[str]  # the jobs it waits for


def segment_name(run_name: str, step: int) -> str:
    return f"{run_name}-until-{step}"


def launch_jobs(runs: list[PlannedRun]) -> list[Job]:
    """The jobs and their dependencies: a parent of branches in `runs` becomes a chain of segments ending at its
    branch points (not yet reached ones; the last segment carries the run's own name), a branch waits for the
    segment that writes its checkpoint, a continued run for its parent's last job."""
    points = branch_points(runs)
    jobs: list[Job] = []
    writer: dict[tuple[str, int | None], str] = {}  # (run, step or None for its end) → the job that gets there
    for p in runs:
        name = p.entry.name
        ends = [b for b in points.get(name, []) if p.checkpointed is None or b > p.checkpointed]
        previous = []
        for step in ends:
            segment = copy.deepcopy(p.partial)
            segment.config.checkpoint.stop_at = step
            jobs.append(Job(segment_name(name, step), p, segment, previous + _waits_for(p, writer)))
            writer[(name, step)] = previous_name = jobs[-1].name
            previous = [previous_name]
        jobs.append(Job(name, p, p.partial, previous + ([] if previous else _waits_for(p, writer))))
        writer[(name, None)] = name
    return jobs


def _waits_for(p: PlannedRun, writer: dict) -> list[str]:
    if p.entry.after and (p.entry.after, None) in writer:
        return [writer[(p.entry.after, None)]]
    if p.entry.branch_of:
        key = (p.entry.branch_of, p.entry.branch_step)
        if key in writer:
            return [writer[key]]
        if (p.entry.branch_of, None) in writer:  # the parent had already passed the branch step
            return []
    return []


def dependency_lines(jobs: list[Job]) -> str:
    return "\n".join(f"{job.name}" + (f"  ← after {', '.join(job.after)}" if job.after else "") for job in jobs)


def launch_plan(runs: list[PlannedRun], executor_kind: str, executor_options: dict | None = None,
                title: str = "sweep", dryrun: bool = False, detach: bool = False,
                base_dir: str | None = None, stages: list | None = None) -> run.Experiment:
    """One experiment of `launch_jobs(runs)`: on Slurm each job depends (afterok) on the jobs it waits for and
    the others start together; locally the jobs go one after the other in that order (which has every job after
    those it waits for). `base_dir`: where NeMo-Run keeps the experiment (default: its home). `stages`
    (recipes.sweep_eval): exports, evaluations and the report, after the training jobs they wait for."""
    from recipes.sweep_eval import none_after_a_failure, stage_executor

    slurm = executor_kind == "slurm"
    jobs, stages = launch_jobs(runs), stages or []
    launch.check_experiment_names(title, [job.name for job in jobs] + [stage.name for stage in stages])
    # locally, Ctrl-C stops the running job as a preemption does and starts no later one (recipes.interrupt)
    interrupt = None if slurm or dryrun or detach else LocalInterrupt(os.fdopen(os.dup(2), "w"))
    # locally, a line per job as it starts (NeMo-Run runs them one after the other and prints nothing of them)
    progress = ChainProgress([job.name for job in jobs] + [stage.name for stage in stages], sys.stdout) \
        if interrupt else None
    with launch._interruptible(interrupt), \
            none_after_a_failure({stage.name for stage in stages} if interrupt else set(), progress), \
            run.Experiment(title, base_dir=base_dir, log_level="WARN", skip_status_at_exit=True,
                           enable_goodbye_message=False,  # NeMo-Run's ~20 lines of status and hints
                           clean_mode=not (slurm or dryrun or detach)) as exp:  # and, locally, its banners and panel
        job_ids: dict[str, str] = {}
        for job in jobs:
            executor = launch.make_executor(executor_kind, job.partial, executor_options)
            depends = [job_ids[name] for name in job.after] if slurm and job.after else None
            job_ids[job.name] = exp.add(as_launched(job.partial), executor=executor, name=job.name,
                                        dependencies=depends)
        for stage in stages:
            executor, task = stage_executor(stage, executor_kind, executor_options)
            depends = [job_ids[name] for name in stage.after] if slurm and stage.after else None
            job_ids[stage.name] = exp.add(task, executor=executor, name=stage.name, dependencies=depends)
        run_dirs = {job.name: job.partial.config.run_dir for job in jobs}
        stamps_before = {name: launch.status_stamp(run_dir) for name, run_dir in run_dirs.items()}
        if dryrun:
            exp.dryrun(log=False, delete_exp_dir=False)  # the scripts are written; 38 printed would drown the plan
        else:  # Slurm: submitted detached and followed with scontrol (launch.follow_slurm; NeMo-Run's needs sacct)
            exp.run(sequential=not slurm, detach=detach or slurm, tail_logs=False)
    if slurm and not dryrun:
        statuses = launch.follow_slurm(exp, detach)[1]
    else:
        statuses = {} if dryrun or detach else exp.status(return_dict=True)
    if progress is not None:
        last = statuses.get(progress.current[0]) if progress.current else None
        progress.finished(None if last is None else str(last["status"]) == "SUCCEEDED")
    if statuses:
        failed = {name: str(info["status"]) for name, info in statuses.items()
                  if str(info["status"]) != "SUCCEEDED"}
        trained = [name for name in failed if name in run_dirs]
        if failed and interrupt is not None and interrupt.requested:
            raise launch.TaskInterruptedError(launch.interrupted_report(trained, run_dirs))
        if refused := launch.refusals(trained, run_dirs, stamps_before, None if slurm else exp._exp_dir):
            raise launch.TaskRefusedError(refused)
        if failed and not trained:  # only stages of the chain: their own lines (recipes.eval_run)
            from recipes.eval_run import raise_failure

            raise_failure(exp, failed, launch.slurm_jobs(exp) if slurm else None)
        if failed:
            raise launch.TaskFailedError(f"experiment {exp._id}: run(s) did not succeed: {failed}; logs under "
                                         f"{exp._exp_dir}")
    return exp
