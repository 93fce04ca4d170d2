"""One command for a whole experiment grid: plan, then launch (or dry-run) every run as one NeMo-Run experiment.

    python -m recipes.sweep paper --plan                                     # the table only
    python -m recipes.sweep paper --executor slurm --dryrun executor.account=acct
    python -m recipes.sweep paper --executor slurm --only '610m-*' executor.account=acct --detach
    python -m recipes.sweep tiny --run-root runs/grid --data-path runs/demo_data   # CPU, scaled down

The plan lists every run (steps per phase, tokens, GPU-hours from `mlmclm.flops` at a stated MFU) and its state.
Finished runs (latest checkpoint = total steps) are skipped once the checks a resume makes accept this config (a
changed setting, `seed=99`, is refused naming it, never ignored); unfinished ones are launched again and resume from
their run directory. A run that continues another's decayed checkpoint (`after`) depends on it: on Slurm through
an `afterok` dependency, locally by running after it. A branch (`branch_of`, mlmclm.train.branch) starts from its
parent's checkpoint at the branch step with the parent's full state: the parent keeps those checkpoints
(`checkpoint.keep_steps`) and runs as segments that end at them (`checkpoint.stop_at`), one job each, chained;
each branch depends on the segment that writes its checkpoint (Slurm `afterok`; locally, it runs after it), so it
starts as soon as that checkpoint exists and trains only its own steps after it. `--plan` prices the grid with
branching beside without. `key=value` items are recipe parameters for every run that takes them (`nodes=12`) or
`executor.KEY=VALUE`.

`--with-eval` chains, per run, the export (`convert_to_hf --verify`) after its last checkpoint and its evaluation
(`tools/evaluate.py grid`; on Slurm a job array of `--eval-array-tasks` × `--eval-gpus-per-task` GPUs), then the
paper report once every model is scored (recipes/sweep_eval.py). The suite: `--eval-data-root DIR` (the paper's,
fetched for offline nodes; the paper grid's default suite), `--eval-smoke` (the tiny grid's default), or
`--eval-tasks FILE`, with `--eval-seeds`, `--eval-lrs`, `--eval-max-steps`. A finished sweep run again starts
nothing and says so.
"""
from __future__ import annotations

if __name__ == "__main__":  # run as a command: quiet before megatron's and torch's import-time warnings (an import
    from mlmclm import quiet  # of this module as a library leaves the warnings filters alone)

    quiet.install()

import argparse
import sys
import warnings

from mlmclm.config_io import parse_value
from recipes import grid as grids
from recipes import launch
from recipes.finished_runs import check_finished_run_unchanged
from recipes.interrupt import INTERRUPTED_EXIT_CODE
# the plan and the jobs of a launch, by the names tests and recipes.mini use from here
from recipes.sweep_jobs import Job, dependency_lines, launch_jobs, launch_plan, segment_name  # noqa: F401
from recipes.sweep_eval import REPORT_DONE, EvalChain, chain_stages, stamp_evaluations
from recipes.sweep_eval import describe as describe_stages
from recipes.sweep_plan import (DEFAULT_MFU, DEFAULT_PEAK, RUN_ROOTS, MemoryPlan, PlannedRun,  # noqa: F401
                                branch_points, build_plan, host_run_dir, memory_plan, plan_table, run_state, select,
                                to_launch)


def _split_items(items: list[str]) -> tuple[dict, dict]:
    params, executor = {}, {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not of the form key=value")
        target = executor if key.startswith("executor.") else params
        target[key.removeprefix("executor.")] = parse_value(raw)
    return params, executor


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
    add_chain_arguments(parser)
    args = parser.parse_intermixed_args(argv)
    # `--only` takes every word after it: a key=value there is an override the user wrote after the patterns (a run
    # name never holds "="), never a pattern to match and drop
    if args.only is not None:
        args.overrides += [item for item in args.only if "=" in item]
        args.only = [item for item in args.only if "=" not in item]
        if not args.only:
            parser.error("--only needs at least one run name or pattern")
    try:
        if args.name is not None:  # before the plan is built or any folder made
            launch.check_experiment_names(args.name, [], what="--name")
        params, executor = _split_items(args.overrides)
        checkpoint_dir = executor.get("checkpoint_dir")
        if checkpoint_dir is None and args.executor == "slurm":
            from cluster.executors import _setting

            checkpoint_dir = _setting("checkpoint_dir", None)
        everything = build_plan(args.grid, params=params, run_root=args.run_root, data_path=args.data_path,
                                checkpoint_dir=checkpoint_dir, mfu=args.mfu)
        planned = select(everything, args.only)
        print(plan_table(planned, args.mfu, DEFAULT_PEAK))
        chain = eval_chain(args) if args.with_eval else None
        if args.plan:
            if chain is not None:  # what the chain adds, each evaluation's command (its price: grid --list)
                stages = chain_stages(planned, {p.entry.name for p in planned if not p.finished}, chain,
                                      checkpoint_dir, local=args.executor == "local")
                print(f"then, with --with-eval:\n{describe_stages(stages)}")
                if evals := [s for s in stages if s.kind == "eval"]:
                    print(f"each evaluation: a job array of {chain.array_tasks} × {chain.gpus_per_task} GPU(s) "
                          f"running `tools/evaluate.py {' '.join(evals[0].eval_job.grid_argv())}` (its cost: "
                          f"`tools/evaluate.py grid --suite paper --list`)")
            return 0
        runs = to_launch(planned, everything)
        for finished in (p for p in planned if p.finished):  # skipped only if a resume would accept this config
            check_finished_run_unchanged(finished.partial, finished.host_dir)
        stages = [] if chain is None else chain_stages(planned, {p.entry.name for p in runs}, chain,
                                                       checkpoint_dir, local=args.executor == "local")
        if not runs and not stages:
            print("nothing to launch: every selected run has finished" + (
                f", been exported and evaluated, and the report is written ({chain.report_dir}/{REPORT_DONE})"
                if chain else ""))
            return 0
        if args.executor == "local" and not args.dryrun and runs:
            launch.prepare_local_data([p.entry.recipe for p in runs], [p.partial for p in runs])
        if args.dryrun or stages:
            print("jobs and their dependencies:\n" + "\n".join(
                filter(None, [dependency_lines(launch_jobs(runs)), describe_stages(stages)])))
        if not args.dryrun:
            stamp_evaluations(stages, checkpoint_dir)
        exp = launch_plan(runs, args.executor, executor, title=args.name or f"sweep-{args.grid}",
                          dryrun=args.dryrun, detach=args.detach, stages=stages)
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
    if stages and not (args.dryrun or args.detach):
        print(f"report: {chain.report_dir}/{REPORT_DONE}")
    return 0


def add_chain_arguments(parser: argparse.ArgumentParser) -> None:
    from recipes.eval_job import DEVICES
    from recipes.eval_run import add_suite_arguments

    chain = parser.add_argument_group("--with-eval: export, evaluation and report after each run")
    chain.add_argument("--with-eval", action="store_true", help="chain the export, evaluation and paper report")
    add_suite_arguments(chain, prefix="eval-")
    chain.add_argument("--eval-array-tasks", type=int, default=1, help="Slurm: tasks of each model's job array")
    chain.add_argument("--eval-gpus-per-task", type=int, help="GPUs of each task (default: 8 for the paper, else 1)")
    chain.add_argument("--eval-device", choices=DEVICES, default="auto")
    for name in ("export-root", "eval-root", "report-dir"):
        chain.add_argument(f"--{name}", help="default: a sibling of the run root (ROOT-hf, ROOT-eval, ROOT-report)")


def eval_chain(args: argparse.Namespace) -> EvalChain:
    """The chain's folders and evaluation from the flags (its suite by default: the paper's for the paper grid,
    the smoke tasks otherwise)."""
    from recipes.eval_run import suite_from

    local = args.executor == "local"
    if not (args.eval_smoke or args.eval_tasks or args.eval_data_root) and args.grid != "paper":
        args.eval_smoke = True
    suite = suite_from(args, prefix="eval-", absolute=local)
    gpus = args.eval_gpus_per_task or (8 if args.grid == "paper" else 1)
    if local and args.eval_array_tasks != 1:
        raise ValueError("--eval-array-tasks sizes the Slurm job array; locally one command runs each evaluation")
    chain = EvalChain.beside(args.run_root or RUN_ROOTS[args.grid], suite=suite, array_tasks=args.eval_array_tasks,
                             gpus_per_task=gpus, device=args.eval_device)
    chain = EvalChain(args.export_root or chain.export_root, args.eval_root or chain.eval_root,
                      args.report_dir or chain.report_dir, suite, chain.array_tasks, gpus, chain.device)
    return chain.absolute() if local else chain


if __name__ == "__main__":
    sys.exit(main())
