"""One command for a whole experiment grid: plan, then launch (or dry-run) every run as one NeMo-Run experiment.

    python -m recipes.sweep paper --plan                                     # the table only
    python -m recipes.sweep paper --executor slurm --dryrun executor.account=acct
    python -m recipes.sweep paper --executor slurm --only '610m-*' executor.account=acct --detach
    python -m recipes.sweep tiny --run-root runs/grid --data-path runs/demo_data   # CPU, scaled down

The plan lists every run (steps per phase, tokens, GPU-hours from `mlmclm.flops` at a stated MFU) and its state.
Finished runs (latest checkpoint = total steps) are skipped; unfinished ones are launched again and resume from
their run directory. A run that continues another's decayed checkpoint (`after`) depends on it: on Slurm through
an `afterok` dependency, locally by running after it. A branch (`branch_of`, mlmclm.train.branch) starts from its
parent's checkpoint at the branch step with the parent's full state: the parent keeps those checkpoints
(`checkpoint.keep_steps`) and runs as segments that end at them (`checkpoint.stop_at`), one job each, chained;
each branch depends on the segment that writes its checkpoint (Slurm `afterok`; locally, it runs after it), so it
starts as soon as that checkpoint exists and trains only its own steps after it. `--plan` prices the grid with
branching beside without. `key=value` items are recipe parameters for every run that takes them (`nodes=12`) or
`executor.KEY=VALUE`.
"""
from __future__ import annotations

import argparse
import copy
import fnmatch
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import nemo_run as run

from mlmclm import flops
from mlmclm.config_io import parse_value
from mlmclm.model.memory import GIB, H100_80GB_BYTES, MemoryEstimate, RankLayout, estimate_peak_memory
from mlmclm.train.branch import check_branch_plan
from recipes import grid as grids
from recipes import launch, registry
from recipes.base import PAPER_RUN_ROOT, tokens_per_sample, validate, world_size
from recipes.interrupt import INTERRUPTED_EXIT_CODE, LocalInterrupt
from recipes.progress import checkpointed_step
from recipes.tiny import TINY_RUN_ROOT

DEFAULT_MFU = 0.40  # assumed model-FLOPs utilisation for the GPU-hours estimate (not measured)
DEFAULT_PEAK = "H100"  # dense bf16 peak of this GPU (mlmclm/flops.py)
RUN_ROOTS = {"paper": PAPER_RUN_ROOT, "tiny": f"{TINY_RUN_ROOT}/grid", "mini": "runs/mini/runs"}


@dataclass
class PlannedRun:
    entry: grids.GridRun
    partial: run.Partial
    phases: list[tuple[str, int]]  # (objective, steps)
    total_steps: int
    tokens: float
    gpu_hours: float  # the whole run's, as if trained from step 0
    own_gpu_hours: float  # the steps this run trains itself: after the branch step for a branch
    state: str  # "new", "partial N/M", "finished", "unknown" (run dir not visible from here)
    checkpointed: int | None = None  # its latest checkpoint's step, where visible
    host_dir: Path | None = None
    memory: "MemoryPlan | None" = None  # estimated peak GPU memory per rank (mean and worst micro-batch)

    @property
    def finished(self) -> bool:
        return self.state == "finished"


@dataclass(frozen=True)
class MemoryPlan:
    layout: str  # e.g. "tp1 pp1 dp192"
    mean: MemoryEstimate
    worst: MemoryEstimate


def memory_plan(cfg, world: int, seq_length: int, capacity: int = H100_80GB_BYTES) -> MemoryPlan:
    """The estimate (mlmclm.model.memory) at the mean and at the worst micro-batch of this run, for its most
    memory-hungry phase; refuses a layout whose worst case does not fit `capacity` (an 80 GB H100)."""
    par = cfg.parallel
    dp = par.data_parallel_size(world)
    layout = RankLayout(par.tensor_parallel, par.pipeline_parallel, par.sequence_parallel, dp,
                        cfg.optimizer.distributed_optimizer, cfg.num_microbatches(dp), bool(cfg.precision.fp8))
    mean_tokens = worst_tokens = 0
    for phase, data, model in zip(cfg.phases, cfg.phase_data(), cfg.phase_models()):
        # a phase's own prepared rows are at most its context long (checked when the run starts)
        rows = seq_length if phase.data is None else model.max_position_embeddings
        lengths = data.random_length
        if lengths is not None:  # one row of micro_batch samples; at worst every sample is max_length long
            mean, worst = round(cfg.micro_batch_size * lengths.mean), cfg.worst_row_tokens(rows, data)
        else:
            mean = worst = cfg.micro_batch_size * rows
        mean_tokens, worst_tokens = max(mean_tokens, mean), max(worst_tokens, worst)
    predicted = max(1.0 if p.objective.kind == "clm" or not cfg.sparse_mlm_head else p.objective.max_ratio
                    for p in cfg.phases)
    plan = MemoryPlan(f"tp{par.tensor_parallel} pp{par.pipeline_parallel} dp{dp}",
                      estimate_peak_memory(cfg.model, layout, mean_tokens, predicted, cfg.head_chunk_tokens),
                      estimate_peak_memory(cfg.model, layout, worst_tokens, predicted, cfg.head_chunk_tokens))
    if plan.worst.total > capacity:
        raise ValueError(f"{cfg.run_dir}: layout {plan.layout} does not fit an {capacity / GIB:.1f} GiB GPU at the "
                         f"worst-case micro-batch: {plan.worst.summary()} (mean case {plan.mean.total / GIB:.1f} "
                         f"GiB); use tensor/pipeline parallelism or fewer samples per forward")
    return plan


def host_run_dir(run_dir: str, checkpoint_dir: str | None) -> Path | None:
    """Where this machine sees a run directory: container paths under /checkpoints map to the executor's
    checkpoint_dir; None when it cannot be seen from here."""
    from cluster.executors import CHECKPOINT_MOUNT_TARGET

    if run_dir == CHECKPOINT_MOUNT_TARGET or run_dir.startswith(CHECKPOINT_MOUNT_TARGET + "/"):
        if not checkpoint_dir:
            return None
        return Path(checkpoint_dir) / run_dir.removeprefix(CHECKPOINT_MOUNT_TARGET).lstrip("/")
    return Path(run_dir)


def run_state(run_dir: Path | None, total_steps: int) -> str:
    if run_dir is None:
        return "unknown"
    step = checkpointed_step(run_dir)
    if step is None:
        return "new"
    return "finished" if step >= total_steps else f"partial {step}/{total_steps}"


def _split_items(items: list[str]) -> tuple[dict, dict]:
    params, executor = {}, {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not of the form key=value")
        target = executor if key.startswith("executor.") else params
        target[key.removeprefix("executor.")] = parse_value(raw)
    return params, executor


def _step_flops(cfg, seq_length: int, causal: bool) -> float:
    """Expected model FLOPs of one step: random-length samples each attend within themselves (E[L] and E[L²] of
    the uniform lengths), fixed rows over the whole row."""
    lengths = cfg.data.random_length
    if lengths is None:
        return flops.flops_per_step(cfg.model, seq_length, cfg.global_batch_size, causal=causal)
    return flops.mean_flops_for_uniform_lengths(cfg.model, lengths.min_length, lengths.max_length,
                                                cfg.global_batch_size, causal=causal)


def _flops_after(cfg, seq_length: int, phases: list[tuple[str, int]], start: int) -> float:
    """Model FLOPs of the steps from `start` on."""
    total, begin = 0.0, 0
    for kind, steps in phases:
        end = begin + steps
        total += max(0, end - max(begin, start)) * _step_flops(cfg, seq_length, kind == "clm")
        begin = end
    return total


def build_plan(grid_name: str, *, params: dict | None = None,
               run_root: str | None = None, data_path: str | None = None, checkpoint_dir: str | None = None,
               mfu: float = DEFAULT_MFU, peak: str = DEFAULT_PEAK,
               grid_options: dict | None = None) -> list[PlannedRun]:
    """Every run of the grid, built and validated, with its cost and state; `grid_options` are the grid
    function's arguments (the mini grid's steps and seeds)."""
    if not 0 < mfu <= 1:
        raise ValueError(f"--mfu must be in (0, 1], got {mfu}")
    entries = grids.get_grid(grid_name, **(grid_options or {}))
    params = dict(params or {})
    unused = set(params) - {p for e in entries for p in registry.get(e.recipe).parameters()}
    if unused:
        raise ValueError(f"parameter(s) {sorted(unused)} are taken by no recipe of grid {grid_name!r}")
    root = (run_root or RUN_ROOTS[grid_name]).rstrip("/")
    peak_flops = flops.peak_flops("bf16", peak)
    run_dirs = {e.name: f"{root}/{e.name}" for e in entries}
    planned = []
    for entry in entries:
        recipe = registry.get(entry.recipe)
        accepted = recipe.parameters()
        values = {**entry.params, **{k: v for k, v in params.items() if k in accepted}, "run_dir": run_dirs[entry.name]}
        if data_path:
            values["data_path"] = data_path
        if entry.after:
            values["init_from"] = run_dirs[entry.after]
        partial = recipe.build(**values)
        if entry.branch_of:
            partial.config.checkpoint.branch_from = run_dirs[entry.branch_of]
            partial.config.checkpoint.branch_step = entry.branch_step
        cfg = validate(partial)
        steps = cfg.phase_steps()
        phases = [(p.objective.kind, s) for p, s in zip(cfg.phases, steps)]
        seq = recipe.seq_length
        to_hours = 1 / (mfu * peak_flops) / 3600
        host_dir = host_run_dir(cfg.run_dir, checkpoint_dir)
        planned.append(PlannedRun(entry, partial, phases, cfg.total_steps, cfg.total_steps * cfg.global_batch_size
                                  * tokens_per_sample(cfg, seq), _flops_after(cfg, seq, phases, 0) * to_hours,
                                  _flops_after(cfg, seq, phases, entry.branch_step or 0) * to_hours,
                                  run_state(host_dir, cfg.total_steps),
                                  None if host_dir is None else checkpointed_step(host_dir), host_dir,
                                  memory_plan(cfg, world_size(partial), seq)))
    _plan_branches(planned)
    return planned


def _plan_branches(planned: list[PlannedRun]) -> None:
    """Each parent keeps its children's branch checkpoints; each branch is checked against its parent now (the
    trainer checks again against the checkpoint): a grid whose branches would not be exact is refused here."""
    by_name = {p.entry.name: p for p in planned}
    for name, points in branch_points(planned).items():
        by_name[name].partial.config.checkpoint.keep_steps = points
    for child in planned:
        if child.entry.branch_of:
            parent = by_name[child.entry.branch_of]
            check_branch_plan(validate(parent.partial), validate(child.partial), child.entry.branch_step,
                              f"{child.entry.name} (a branch of {parent.entry.name})")


def branch_points(planned: list[PlannedRun]) -> dict[str, list[int]]:
    """parent name → the sorted steps its runs in `planned` branch from."""
    points: dict[str, set[int]] = {}
    for p in planned:
        if p.entry.branch_of:
            points.setdefault(p.entry.branch_of, set()).add(p.entry.branch_step)
    return {name: sorted(steps) for name, steps in points.items()}


def select(planned: list[PlannedRun], only: list[str] | None) -> list[PlannedRun]:
    """The runs whose names match one of the `only` shell patterns (all when None)."""
    if not only:
        return planned
    chosen = [p for p in planned if any(fnmatch.fnmatchcase(p.entry.name, pattern) for pattern in only)]
    if not chosen:
        raise ValueError(f"--only {only} matches no run of the grid")
    return chosen


def to_launch(planned: list[PlannedRun], all_runs: list[PlannedRun] | None = None) -> list[PlannedRun]:
    """The unfinished runs, refusing one whose parent is neither finished (its branch checkpoint written, for a
    branch) nor launched with it."""
    launching = [p for p in planned if not p.finished]
    names = {p.entry.name for p in launching}
    states = {p.entry.name: p for p in (all_runs or planned)}
    for p in launching:
        parent = p.entry.after
        if parent and parent not in names and not (parent in states and states[parent].finished):
            raise ValueError(f"{p.entry.name} continues {parent}, which has not finished and is not selected; "
                             f"add it to --only (or let it finish first)")
        parent = p.entry.branch_of
        if parent and parent not in names and not _branch_checkpoint_written(states.get(parent), p):
            raise ValueError(f"{p.entry.name} branches from {parent} at step {p.entry.branch_step}, whose checkpoint "
                             f"is not written and which is not selected; add it to --only")
    return launching


def _branch_checkpoint_written(parent: PlannedRun | None, child: PlannedRun) -> bool:
    if parent is None or parent.host_dir is None:
        return False
    return (parent.host_dir / "checkpoints" / f"iter_{child.entry.branch_step:07d}" / "train_state.json").exists()


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


def _hours(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


def plan_table(planned: list[PlannedRun], mfu: float, peak: str) -> str:
    lines = [f"{'run':<30} {'phases (steps)':<26} {'tokens':>9} {'GPU-h':>8} {'own GPU-h':>9} "
             f"{'after / branch of':<24} {'layout':<16} {'GiB mean/worst':>14}  state"]
    for p in planned:
        phases = " → ".join(f"{kind} {steps}" for kind, steps in p.phases)
        source = p.entry.after or (f"{p.entry.branch_of}@{p.entry.branch_step}" if p.entry.branch_of else "-")
        memory = "-" if p.memory is None else f"{p.memory.mean.total / GIB:.1f}/{p.memory.worst.total / GIB:.1f}"
        layout = "-" if p.memory is None else p.memory.layout
        lines.append(f"{p.entry.name:<30} {phases:<26} {p.tokens / 1e9:>8.1f}B {_hours(p.gpu_hours):>8} "
                     f"{_hours(p.own_gpu_hours):>9} {source:<24} {layout:<16} {memory:>14}  {p.state}")
    todo = [p for p in planned if not p.finished]
    branches = [p for p in planned if p.entry.branch_of]
    lines.append(f"{len(planned)} runs, {sum(p.tokens for p in planned) / 1e9:,.1f}B tokens, "
                 f"{_hours(sum(p.own_gpu_hours for p in planned))} GPU-hours at {mfu:.0%} MFU of the {peak} bf16 peak "
                 f"(assumed, not measured) with branching ({len(branches)} runs branch off their parent's stable "
                 f"phase and train only their own steps), {_hours(sum(p.gpu_hours for p in planned))} without; "
                 f"to launch: {len(todo)} runs, {_hours(sum(p.own_gpu_hours for p in todo))} GPU-hours")
    sized = [p for p in planned if p.memory is not None]
    if sized:
        worst = max(sized, key=lambda p: p.memory.worst.total)
        lines.append(f"peak GPU memory per rank, estimated (mlmclm/model/memory.py, unverified on a GPU): mean "
                     f"micro-batch vs the worst (every sample at its longest); the largest is {worst.entry.name}: "
                     f"{worst.memory.worst.summary()}")
    return "\n".join(lines)


def launch_plan(runs: list[PlannedRun], executor_kind: str, executor_options: dict | None = None,
                title: str = "sweep", dryrun: bool = False, detach: bool = False,
                base_dir: str | None = None) -> run.Experiment:
    """One experiment of `launch_jobs(runs)`: on Slurm each job depends (afterok) on the jobs it waits for and
    the others start together; locally the jobs go one after the other in that order (which has every job after
    those it waits for). `base_dir`: where NeMo-Run keeps the experiment (default: its home)."""
    slurm = executor_kind == "slurm"
    jobs = launch_jobs(runs)
    # locally, Ctrl-C stops the running job as a preemption does and starts no later one (recipes.interrupt)
    interrupt = None if slurm or dryrun or detach else LocalInterrupt(os.fdopen(os.dup(2), "w"))
    with launch._interruptible(interrupt), \
            run.Experiment(title, base_dir=base_dir, log_level="WARN", skip_status_at_exit=True,
                           enable_goodbye_message=False,  # NeMo-Run's ~20 lines of status and hints
                           clean_mode=not (slurm or dryrun or detach)) as exp:  # and, locally, its banners and panel
        job_ids: dict[str, str] = {}
        for job in jobs:
            executor = launch.make_executor(executor_kind, job.partial, executor_options)
            depends = [job_ids[name] for name in job.after] if slurm and job.after else None
            job_ids[job.name] = exp.add(job.partial, executor=executor, name=job.name, dependencies=depends)
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
    if statuses:
        failed = {name: str(info["status"]) for name, info in statuses.items()
                  if str(info["status"]) != "SUCCEEDED"}
        if failed and interrupt is not None and interrupt.requested:
            raise launch.TaskInterruptedError(launch.interrupted_report(list(failed), run_dirs))
        if refused := launch.refusals(list(failed), run_dirs, stamps_before, None if slurm else exp._exp_dir):
            raise launch.TaskRefusedError(refused)
        if failed:
            raise launch.TaskFailedError(f"experiment {exp._id}: run(s) did not succeed: {failed}; logs under "
                                         f"{exp._exp_dir}")
    return exp


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message=".*(Transformer Engine|Apex).*")
    parser = argparse.ArgumentParser(prog="python -m recipes.sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("grid", choices=sorted(grids.GRIDS))
    parser.add_argument("overrides", nargs="*", help="recipe parameters for every run, or executor.KEY=VALUE")
    parser.add_argument("--executor", choices=launch.EXECUTORS, default="local")
    parser.add_argument("--only", nargs="+", metavar="PATTERN", help="run names or shell patterns ('610m-clm-*')")
    parser.add_argument("--plan", action="store_true", help="print the plan, launch nothing")
    parser.add_argument("--dryrun", action="store_true", help="write the launch scripts, submit nothing")
    parser.add_argument("--detach", action="store_true", help="return after submitting (Slurm)")
    parser.add_argument("--run-root", help="parent of the run directories (default: the grid's)")
    parser.add_argument("--data-path", help="prepared data for every run (default: each recipe's)")
    parser.add_argument("--mfu", type=float, default=DEFAULT_MFU, help="for the GPU-hours estimate")
    parser.add_argument("--name", help="experiment title (default: sweep-GRID)")
    args = parser.parse_intermixed_args(argv)
    try:
        params, executor = _split_items(args.overrides)
        checkpoint_dir = executor.get("checkpoint_dir")
        if checkpoint_dir is None and args.executor == "slurm":
            from cluster.executors import _setting

            checkpoint_dir = _setting("checkpoint_dir", None)
        everything = build_plan(args.grid, params=params, run_root=args.run_root, data_path=args.data_path,
                                checkpoint_dir=checkpoint_dir, mfu=args.mfu)
        planned = select(everything, args.only)
        print(plan_table(planned, args.mfu, DEFAULT_PEAK))
        if args.plan:
            return 0
        runs = to_launch(planned, everything)
        if not runs:
            print("nothing to launch: every selected run has finished")
            return 0
        if args.executor == "local" and not args.dryrun:
            launch.prepare_local_data([p.entry.recipe for p in runs], [p.partial for p in runs])
        if args.dryrun:
            print("jobs and their dependencies:\n" + dependency_lines(launch_jobs(runs)))
        exp = launch_plan(runs, args.executor, executor, title=args.name or f"sweep-{args.grid}",
                          dryrun=args.dryrun, detach=args.detach)
    except (ValueError, TypeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except launch.TaskInterruptedError as err:
        print(str(err), file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    except launch.TaskRefusedError as err:  # the trainer's own message (an incompatible resume, bad data), once
        print(f"error: {err}", file=sys.stderr)
        return 2
    except launch.TaskFailedError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"experiment directory: {exp._exp_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
