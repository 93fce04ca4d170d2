"""`python -m recipes eval`: the fine-tuning grid (`tools/evaluate.py grid`) through NeMo-Run — locally one command,
on Slurm a job array of K tasks × G GPUs sharing one output folder (recipes/eval_job.py).

    python -m recipes eval --model mine=$PWD/out/mine_hf --smoke --output $PWD/eval/mine          # this machine
    python -m recipes eval --model 610m-clm-42k=/lustre/hf/610m-clm-42k --data-root /lustre/eval_data \\
        --output /lustre/eval/610m-clm-42k --array-tasks 4 --gpus-per-task 8 --executor slurm executor.account=ACCT

The suite and protocol flags are `tools/evaluate.py grid`'s (--smoke | --tasks F | --data-root D [--task T],
--lrs, --seeds, --max-steps, --batch-size); `executor.KEY=VALUE` sets the Slurm executor (cluster/executors.py).
A preempted task stops, gives its units back and is requeued; a refusal (a model folder that is not a model, bad
task data) ends the job FAILED, never requeued, and its one line is printed here (exit 2). The models are checked
where the job runs (on Slurm their paths may be the job's, and in a chained sweep they do not exist yet); this
command checks its own arguments, and on Slurm that every path is one the nodes reach. Running it again runs
only the units left.
"""
from __future__ import annotations

if __name__ == "__main__":  # run as a command: quiet before megatron's and torch's import-time warnings (an import
    from mlmclm import quiet  # of this module as a library leaves the warnings filters alone)

    quiet.install()

import argparse
import re
import sys
from pathlib import Path

import nemo_run as run

from mlmclm.config_io import parse_value
from recipes.eval_job import DEVICES, REPO, EvalJob, EvalSuite, eval_task, job_checkout, local_eval_executor, \
    slurm_eval_executor

EXECUTORS = ("local", "slurm")
TASK_NAME = "eval"


def list_item(convert, what: str):
    """An argparse type for one value of a list flag (`--seeds 0 1`). A key=value after the list is read as one of
    its values: the refusal says where it goes instead."""
    def parse(text: str):
        try:
            return convert(text)
        except ValueError:
            hint = (": a key=value after a list flag is read as one of its values; put it before the flags, or end the "
                    "list with --" if "=" in text else "")
            raise argparse.ArgumentTypeError(f"invalid {what} {text!r}{hint}") from None

    parse.__name__ = what  # argparse names the type in some messages
    return parse


def add_suite_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """evaluate.py grid's suite and protocol flags, as `--{prefix}smoke` etc. (the sweep prefixes `eval-`)."""
    flag = lambda name: f"--{prefix}{name}"  # noqa: E731
    parser.add_argument(flag("smoke"), action="store_true", help="the embedded smoke tasks")
    parser.add_argument(flag("tasks"), metavar="FILE", help="a JSON list of task specs (docs/evaluation.md)")
    parser.add_argument(flag("data-root"), metavar="DIR",
                        help="the paper suite from a folder `tools/evaluate.py fetch` wrote (offline nodes)")
    parser.add_argument(flag("task"), action="append", default=[], metavar="NAME", help="only this paper task")
    parser.add_argument(flag("lrs"), type=list_item(float, "learning rate"), nargs="+", default=[])
    parser.add_argument(flag("seeds"), type=list_item(int, "seed"), nargs="+", default=[])
    parser.add_argument(flag("max-steps"), type=int)
    parser.add_argument(flag("batch-size"), type=int)


def suite_from(args: argparse.Namespace, prefix: str = "", absolute: bool = False) -> EvalSuite:
    """The EvalSuite the flags of `add_suite_arguments(prefix)` name; `absolute`: paths made absolute here (a
    local job runs in NeMo-Run's folder, not in this one)."""
    get = lambda name: getattr(args, prefix.replace("-", "_") + name)  # noqa: E731
    path = lambda value: str(Path(value).absolute()) if value and absolute else value  # noqa: E731
    return EvalSuite(smoke=get("smoke"), tasks_file=path(get("tasks")), data_root=path(get("data_root")),
                     paper_tasks=tuple(get("task")), lrs=tuple(get("lrs")), seeds=tuple(get("seeds")),
                     max_steps=get("max_steps"), batch_size=get("batch_size"))


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m recipes eval", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="executor.KEY=VALUE")
    parser.add_argument("--model", action="append", default=[], metavar="LABEL=HF_MODEL_DIR")
    parser.add_argument("--output", required=True, help="the shared output folder (run records, summary)")
    add_suite_arguments(parser)
    parser.add_argument("--array-tasks", type=int, default=1, help="Slurm: tasks of the job array (default 1)")
    parser.add_argument("--gpus-per-task", type=int, default=1,
                        help="GPUs of each task, its --workers (without GPUs: worker processes); default 1")
    parser.add_argument("--device", choices=DEVICES, default="auto")
    parser.add_argument("--executor", choices=EXECUTORS, default="local")
    parser.add_argument("--dryrun", action="store_true", help="write the launch scripts, submit nothing")
    parser.add_argument("--detach", action="store_true", help="return after submitting (Slurm)")
    parser.add_argument("--name", help="experiment title (default: eval)")
    return parser.parse_intermixed_args(argv)


def build_job(args: argparse.Namespace) -> tuple[EvalJob, dict]:
    """The job and the executor options the arguments name (ValueError, one line, on bad input)."""
    local = args.executor == "local"
    models = []
    for value in args.model:
        label, sep, directory = value.partition("=")
        if not sep or not label or not directory:
            raise ValueError(f"--model {value!r}: expected LABEL=HF_MODEL_DIR")
        models.append((label, str(Path(directory).absolute()) if local else directory))
    options = {}
    for item in args.overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.startswith("executor."):
            raise ValueError(f"{item!r}: expected executor.KEY=VALUE")
        options[key.removeprefix("executor.")] = parse_value(raw)
    if local and args.array_tasks != 1:
        raise ValueError("--array-tasks is the Slurm job array's size; locally one command runs (its workers: "
                         "--gpus-per-task)")
    output = str(Path(args.output).absolute()) if local else args.output
    return EvalJob(tuple(models), output, suite_from(args, absolute=local), args.array_tasks, args.gpus_per_task,
                   args.device), options


def eval_executor(job: EvalJob, kind: str, options: dict | None = None):
    """(executor, the task) for `kind`: Slurm's job array, or this machine."""
    if kind == "slurm":
        executor = slurm_eval_executor(job, options)
        return executor, eval_task(job, job_checkout(executor))
    if kind == "local":
        gpus = (options or {}).get("gpus")
        if set(options or {}) - {"gpus"}:
            raise ValueError(f"the local executor takes executor.gpus only, got {sorted(options)}")
        if gpus is None:
            import torch

            gpus = torch.cuda.is_available()
        return local_eval_executor(bool(gpus)), eval_task(job, REPO)
    raise ValueError(f"unknown executor {kind!r}; choose one of {EXECUTORS}")


# how evaluate.py, paper_report and convert_to_hf (a bare `error: `) refuse; not srun's `srun: error: ...` lines
REFUSAL_LINE = re.compile(r"^(?:evaluate: |paper_report: )?error: .*$", re.M)


def refusal_in(texts: list[str]) -> str | None:
    """The last one-line refusal the tools printed in these logs, if any."""
    found = [m.group(0) for text in texts for m in REFUSAL_LINE.finditer(text)]
    return found[-1] if found else None


def local_logs(exp_dir: str | Path, task: str) -> list[str]:
    """What a local task printed (NeMo-Run's local executor logs), oldest first."""
    files = sorted(Path(exp_dir, task).rglob("*.log"), key=lambda p: p.stat().st_mtime)
    return [p.read_text(errors="replace") for p in files]


def launch_eval(job: EvalJob, kind: str, options: dict | None = None, title: str = TASK_NAME, dryrun: bool = False,
                detach: bool = False, base_dir: str | None = None) -> run.Experiment:
    """One experiment of one task (Slurm: one job array). Raises launch.TaskRefusedError with the tool's own line
    when the command refused its input, launch.TaskFailedError otherwise when it did not succeed."""
    from recipes import launch

    launch.check_experiment_names(title, [TASK_NAME])
    slurm = kind == "slurm"
    executor, task = eval_executor(job, kind, options)
    with run.Experiment(title, base_dir=base_dir, log_level="WARN", skip_status_at_exit=True,
                        enable_goodbye_message=False, clean_mode=not (slurm or dryrun or detach)) as exp:
        exp.add(task, executor=executor, name=TASK_NAME)
        if dryrun:
            exp.dryrun(log=False, delete_exp_dir=False)
        else:
            exp.run(detach=detach or slurm, tail_logs=not (slurm or detach))
    if dryrun:
        if slurm:
            print(f"=== a job array of {job.array_tasks} task(s) × {job.gpus_per_task} GPU(s), one output folder "
                  f"{job.output}")
            launch.print_slurm_dryrun(exp)
        else:
            print(f"=== will run: python {task.path} {' '.join(task.args)}")
        return exp
    if slurm:
        jobs, statuses = launch.follow_slurm(exp, detach)
    else:
        statuses = {} if detach else exp.status(return_dict=True)
    failed = {name: str(info["status"]) for name, info in statuses.items() if str(info["status"]) != "SUCCEEDED"}
    if failed:
        raise_failure(exp, failed, jobs if slurm else None)
    return exp


def raise_failure(exp: run.Experiment, failed: dict[str, str], jobs: dict[str, str] | None) -> None:
    """A task that did not succeed: its refusal line (TaskRefusedError), else its log's end (TaskFailedError)."""
    from recipes import launch

    refused, reports = [], []
    for name, status in failed.items():
        if jobs is not None:
            from cluster.slurm_jobs import error_lines

            lines = error_lines(exp._exp_dir, jobs[name])
        else:
            lines = [line for text in local_logs(exp._exp_dir, name) for line in text.rstrip().splitlines()[-12:]]
        if line := refusal_in(lines):
            refused.append(f"task {name} refused: {line.split('error: ', 1)[1]}")
        reports.append(f"task {name}: {status}\n" + "\n".join("    " + line for line in lines))
    if refused and len(refused) == len(failed):
        raise launch.TaskRefusedError("\n".join(refused))
    raise launch.TaskFailedError(f"experiment {exp._id}: task(s) did not succeed; logs under {exp._exp_dir}\n"
                                 + "\n".join(reports))


def main(argv: list[str] | None = None) -> int:
    from recipes import launch

    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        title = args.name or TASK_NAME
        launch.check_experiment_names(title, [], what="--name")
        job, options = build_job(args)
        exp = launch_eval(job, args.executor, options, title=title, dryrun=args.dryrun, detach=args.detach)
    except (ValueError, TypeError, launch.TaskFailedError) as err:
        print(f"error: {err}", file=sys.stderr)
        failed = isinstance(err, launch.TaskFailedError) and not isinstance(err, launch.TaskRefusedError)
        return 1 if failed else 2  # bad input, or the command's own refusal: 2
    print(f"experiment directory: {exp._exp_dir}")
    if not (args.dryrun or args.detach):
        print(f"summary: {Path(job.output) / 'summary.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
