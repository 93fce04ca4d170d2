"""The detour family as one NeMo-Run experiment on Slurm: each step a job, each job waiting (`afterok`) for the jobs
whose output it reads, so a failure stops what follows it and the rest of the family runs unattended:

    import ─┬─ detour ── export-detour ──┬─ eval ── report
            └─ control ─ export-control ─┘

`import` converts the source and measures step 0 (on the runs' GPUs); `detour` and `control` train in parallel
(the training executor, sized by the recipe); each export (a CPU job) writes its run's HF directory; `eval` is the
evaluation's own job array (recipes/eval_job.py: `tools/evaluate.py grid` over ROOT/eval, `--workers` a GPU each);
`report` (a CPU job) writes ROOT/report.md. Without a task suite there is no `eval` and the report waits for the
exports. Every path is the job's (under a container mount, or on the shared filesystem: refused at submission
otherwise). Locally the family runs in the same order (recipes/detour_run.py `run_plan`)."""
from __future__ import annotations

from dataclasses import dataclass, field

import nemo_run as run

from recipes import launch
from recipes.detour import DetourPlan, export_run, import_task
from recipes.detour_report import EVAL_DIR, RUNS, report_task
from recipes.eval_job import EvalJob, EvalSuite, eval_task, job_checkout, slurm_eval_executor, slurm_script_executor
from recipes.rank_task import as_launched


@dataclass
class FamilyJob:
    """One job of the family: its task and the jobs it waits for."""
    name: str
    after: list[str]
    task: object = None  # run.Partial or run.Script
    executor: object = None
    paths: dict[str, str | None] = field(default_factory=dict)  # checked reachable from the nodes


def eval_job_of(plan: DetourPlan, suite: EvalSuite, array_tasks: int = 1, gpus_per_task: int = 1,
                device: str = "auto") -> EvalJob:
    """Both exports in one grid (one output folder: ROOT/eval), so the two runs are fine-tuned alike."""
    return EvalJob(tuple((name, f"{plan.root}/export/{name}") for name in RUNS), f"{plan.root}/{EVAL_DIR}", suite,
                   array_tasks, gpus_per_task, device)


def family_jobs(plan: DetourPlan, evaluation: EvalJob | None) -> list[FamilyJob]:
    """The jobs in submission order (every job after those it waits for), without executors."""
    root = str(plan.root)
    jobs = [FamilyJob("import", [], import_task(plan),
                      paths={"source": plan.source if plan.source.startswith("/") else None,
                             "imported": str(plan.imported), "data_path": plan.control.config.data.path})]
    for name, partial in (("detour", plan.detour), ("control", plan.control)):
        jobs.append(FamilyJob(name, ["import"], partial))
    for name in RUNS:
        jobs.append(FamilyJob(f"export-{name}", [name],
                              run.Partial(export_run, run_dir=f"{root}/{name}", imported=str(plan.imported),
                                          target=f"{root}/export/{name}"),
                              paths={"run_dir": f"{root}/{name}", "output": f"{root}/export/{name}"}))
    exports = [f"export-{name}" for name in RUNS]
    if evaluation is not None:
        jobs.append(FamilyJob("eval", exports))
    jobs.append(FamilyJob("report", ["eval"] if evaluation is not None else exports,
                          run.Partial(report_task, root=root, source=plan.source, phase1_steps=plan.phase1_steps,
                                      total_steps=plan.detour.config.total_steps),
                          paths={"root": root}))
    return jobs


def with_executors(jobs: list[FamilyJob], plan: DetourPlan, evaluation: EvalJob | None,
                   options: dict | None) -> list[FamilyJob]:
    """Each job's Slurm executor: the runs the training's (sized by the recipe); the import one task on the runs'
    GPUs of one node (it spawns its own ranks, as the local import does); the exports and the report one task
    without GPUs; the evaluation its job array. Every path a job reads or writes is checked here."""
    from cluster.executors import check_reachable

    options = dict(options or {})
    for job in jobs:
        if job.name in RUNS:
            job.executor = launch.make_executor("slurm", job.task, options)
            continue
        if job.name == "eval":
            job.executor = slurm_eval_executor(evaluation, options)
            job.task = eval_task(evaluation, job_checkout(job.executor))
            continue
        gpus = plan.processes if job.name == "import" else 1
        job.executor = slurm_script_executor(gpus, None, options if job.name == "import" else
                                             {**options, "gpus": False})
        check_reachable(job.executor, job.paths)
    return jobs


def dependency_lines(jobs: list[FamilyJob]) -> str:
    return "\n".join(job.name + (f"  ← after {', '.join(job.after)}" if job.after else "") for job in jobs)


def launch_family(plan: DetourPlan, evaluation: EvalJob | None, options: dict | None = None, title: str = "detour",
                  dryrun: bool = False, detach: bool = False) -> run.Experiment:
    """Submit the family (or, `dryrun`, write its sbatch scripts and print them); unless `detach`, follow the jobs
    until they end. A job that did not succeed raises launch.TaskFailedError naming it and its log's end."""
    jobs = with_executors(family_jobs(plan, evaluation), plan, evaluation, options)
    launch.check_experiment_names(title, [job.name for job in jobs])
    print("jobs and their dependencies:\n" + dependency_lines(jobs), flush=True)
    with run.Experiment(title, log_level="WARN", skip_status_at_exit=True, enable_goodbye_message=False) as exp:
        ids: dict[str, str] = {}
        for job in jobs:
            ids[job.name] = exp.add(as_launched(job.task), executor=job.executor, name=job.name,
                                    dependencies=[ids[name] for name in job.after] or None)
        if dryrun:
            exp.dryrun(log=False, delete_exp_dir=False)
        else:
            exp.run(detach=True, tail_logs=False)  # followed with scontrol (launch.follow_slurm)
    if dryrun:
        launch.print_slurm_dryrun(exp)
        return exp
    jobs_ids, statuses = launch.follow_slurm(exp, detach)
    failed = {name: str(info["status"]) for name, info in statuses.items() if str(info["status"]) != "SUCCEEDED"}
    if failed:
        from recipes.eval_run import raise_failure

        raise_failure(exp, failed, jobs_ids)
    return exp
