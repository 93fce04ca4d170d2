"""One command for the CLM detour and its control (recipes/detour.py): import, both runs, both exports, the evaluation
of both on your tasks, the report.

  python -m recipes.detour_run tiny --root runs/detour                        # CPU twin: tiny ModernBERT, demo corpus
  python -m recipes.detour_run tiny --root runs/detour --smoke --lrs 3e-3 --seeds 0 1 --max-steps 10  # + downstream
  python -m recipes.detour_run tiny --root runs/detour_mine --text notes/*.txt # the twin on your own text
  python -m recipes.detour_run modernbert --source answerdotai/ModernBERT-base --data-path /data/bio-modernbert \\
      --root /checkpoints/detour-bio --tasks /data/bio_tasks.json tokens=10000000000   # as published: a 4-GPU node
  python -m recipes.detour_run modernbert --source /checkpoints/models/ModernBERT-base --data-path /data/bio \\
      --root /checkpoints/detour-bio --tasks /data/bio_tasks.json --executor slurm executor.account=ACCT --dryrun
  python -m recipes.detour_run report --root runs/detour                      # the tables again

`modernbert` takes any ModernBertForMaskedLM (ModernBERT, ModernCamemBERT, base or large); `eurobert` the same
published settings on a EuroBERT. `key=value` sets a parameter of the builder (`tokens=`, `decay_share=`, `lr=`,
`seed=`, ...; the twin: `steps=`, ...); `executor.KEY=VALUE` the Slurm executor (cluster/executors.py).
The evaluation (--smoke | --tasks FILE | --data-root DIR, with --lrs, --seeds, --max-steps, --batch-size: the flags of
`tools/evaluate.py grid`) fine-tunes both exports in one grid (ROOT/eval; `--workers` devices, `--device`), and the
report puts the held-out MLM loss beside each task's score, mean ± 95 % CI over the fine-tuning seeds.
Locally the tasks run through NeMo-Run's local executor, one after the other; finished steps are not run again.
`--executor slurm` submits the family as jobs chained by `afterok` (recipes/detour_chain.py): import, then detour
and control in parallel, then their exports, the evaluation (a job array: --array-tasks × --workers GPUs), the
report; paths are the jobs' (--source a directory the nodes reach)."""
from __future__ import annotations

if __name__ == "__main__":  # run as a command: quiet before megatron's and torch's import-time warnings (an import
    from mlmclm import quiet  # of this module as a library leaves the warnings filters alone)

    quiet.install()

import argparse
import inspect
import json
import sys
from pathlib import Path

import nemo_run as run

from mlmclm.config_io import parse_value
from recipes import detour
from recipes.detour_chain import eval_job_of, launch_family
from recipes.detour_report import PLAN_FILE, RUNS, write_report
from recipes.eval_job import DEVICES, EvalJob
from recipes.eval_run import add_suite_arguments, suite_from
from recipes.launch import launch
from recipes.parameter_types import check_parameter_types

EXECUTORS = ("local", "slurm")


def prepare_twin_data(root: Path, texts: list[str] | None, source: Path) -> Path:
    """The twin's domain data: the demo corpus (every 8th work held out, as the demo does), or the user's text files
    tokenized with the source's tokenizer (every 8th document held out); reused when prepared."""
    from recipes.demo import VALIDATION_EVERY
    from recipes.tiny import prepare_tiny_data

    path = root / "data"
    if (path / "manifest.json").exists():
        return path
    if not texts:
        return prepare_tiny_data(str(path), max_tokens=60_000, validation_every=VALIDATION_EVERY)
    from mlmclm.data.prepare import PrepareConfig, prepare

    prepare(PrepareConfig(inputs=texts, output_dir=str(path), tokenizer=str(source), seq_length=128,
                          progress=False, validation_every=VALIDATION_EVERY))
    return path


NOT_PARAMETERS = ("source", "data_path", "root", "model")  # the flags' (and, `model`, the source's own shape)


def _builder_params(builder, items: list[str]) -> dict:
    known = inspect.signature(builder).parameters
    params = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or key not in known or key in NOT_PARAMETERS:
            raise ValueError(f"{item!r}: expected key=value with key one of "
                             f"{sorted(k for k in known if k not in NOT_PARAMETERS)}, or executor.KEY=VALUE")
        params[key] = parse_value(raw)
    check_parameter_types(f"detour ({builder.__name__})", builder, params)
    return params


def _split_items(items: list[str]) -> tuple[list[str], dict]:
    """The builder's key=value items and the executor's options (`executor.KEY=VALUE`)."""
    builder = [item for item in items if not item.startswith("executor.")]
    options = {}
    for item in items:
        if item.startswith("executor."):
            key, sep, raw = item.removeprefix("executor.").partition("=")
            if not sep or not key:
                raise ValueError(f"{item!r}: expected executor.KEY=VALUE")
            options[key] = parse_value(raw)
    return builder, options


def plain_local_executor() -> run.LocalExecutor:
    """One process (no torchrun: the import spawns its own ranks), with this interpreter's environment on PATH."""
    import os

    return run.LocalExecutor(env_vars={"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                                       "TOKENIZERS_PARALLELISM": "false"})


def run_plan(plan: detour.DetourPlan, export: bool = True, evaluation: EvalJob | None = None,
             eval_options: dict | None = None) -> str:
    """Import (and step 0) as a NeMo-Run task, then the two runs (recipes.launch), then the exports, the evaluation
    of both (`evaluation`: the grid command through NeMo-Run, recipes.eval_run) and the tables."""
    plan.root.mkdir(parents=True, exist_ok=True)
    (plan.root / PLAN_FILE).write_text(json.dumps({"source": plan.source, "phase1_steps": plan.phase1_steps,
                                                   "total_steps": plan.detour.config.total_steps}, indent=2) + "\n")
    if not plan.step0_file.exists():
        with run.Experiment("detour-import", log_level="WARN", skip_status_at_exit=True,
                            enable_goodbye_message=False) as exp:
            exp.add(detour.import_task(plan), executor=plain_local_executor(), name="import")
            exp.run(tail_logs=False)
        status = exp.status(return_dict=True)  # the block's exit waited for the task
        if str(status["import"]["status"]) != "SUCCEEDED" or not plan.step0_file.exists():
            raise RuntimeError(f"the import task did not succeed; its log is under {exp._exp_dir}")
    launch([("detour", plan.detour), ("control", plan.control)], "local", title="detour")
    lines = []
    if export:
        lines += [f"{name}: exported to {path}" for name, path in export_both(plan).items()]
    if evaluation is not None:  # the evaluation's own runner: units, --workers, its output folder's records
        from recipes.eval_run import launch_eval

        launch_eval(evaluation, "local", eval_options, title="detour-eval")
        lines.append(f"evaluated: {evaluation.output}/summary.md")
    table = write_report(plan.root, plan.phase1_steps, plan.detour.config.total_steps)
    return table + "\n".join(lines) + f"\n(table in {plan.root / 'report.md'})"


def export_both(plan: detour.DetourPlan) -> dict[str, Path]:
    """Each run's final checkpoint as a native HF directory (detour.export_run; skipped when already there)."""
    return {name: Path(detour.export_run(partial.config.run_dir, str(plan.imported), str(plan.root / "export" / name)))
            for name, partial in zip(RUNS, (plan.detour, plan.control))}


def _evaluation_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("evaluation of both exports (the flags of tools/evaluate.py grid)")
    add_suite_arguments(group)
    group.add_argument("--workers", type=int, default=1, help="devices of one grid command (GPUs, else CPU "
                                                              "worker processes); on Slurm the GPUs of each task")
    group.add_argument("--array-tasks", type=int, default=1, help="Slurm: tasks of the evaluation's job array")
    group.add_argument("--device", choices=DEVICES, default="auto")


def _evaluation(args: argparse.Namespace, plan: detour.DetourPlan) -> EvalJob | None:
    """The grid over both exports the flags name; None without a suite."""
    local = args.executor == "local"
    suite = suite_from(args, absolute=local)
    if not (suite.smoke or suite.tasks_file or suite.data_root):
        if suite.argv():
            raise ValueError("--lrs/--seeds/--max-steps/--batch-size/--task tune the evaluation: name its tasks with "
                             "--smoke, --tasks FILE or --data-root DIR")
        return None
    if args.no_export:
        raise ValueError("the evaluation fine-tunes the exports: it does not go with --no-export")
    if local and args.array_tasks != 1:
        raise ValueError("--array-tasks is the Slurm job array's size; locally one grid command runs (--workers)")
    return eval_job_of(plan, suite, args.array_tasks, args.workers, args.device)


def _source_shape(source: str, options: dict):
    """On Slurm `--source` is the job's path: its config.json is read where this machine sees it (a container path
    under /checkpoints is the executor's checkpoint_dir here); None where it is this machine's own path or a hub
    name (read as is)."""
    from recipes.sweep_plan import host_run_dir

    if not source.startswith("/"):
        return None
    checkpoint_dir = options.get("checkpoint_dir")
    if checkpoint_dir is None:
        from cluster.executors import _setting

        checkpoint_dir = _setting("checkpoint_dir", None)
    host = host_run_dir(source, checkpoint_dir)
    if host is None or not (host / "config.json").exists():
        raise ValueError(f"--source {source}: no config.json where this machine sees it ({host}); on Slurm --source "
                         f"is a model directory the nodes reach, visible here too")
    return detour.source_model(str(host))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipes detour", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("family", choices=("tiny", "modernbert", "eurobert", "report"))
    parser.add_argument("--root", type=Path, required=True, help="folder of the import, runs, exports and report")
    parser.add_argument("--source", help="HF ModernBERT or EuroBERT: hub name or local directory (tiny: default a "
                                         "new tiny ModernBERT)")
    parser.add_argument("--data-path", help="prepared domain data with a validation split (eurobert: required)")
    parser.add_argument("--text", nargs="+", help="tiny: your own text files as the domain (default: the demo's)")
    parser.add_argument("--no-export", action="store_true", help="skip the two exports")
    parser.add_argument("--executor", choices=EXECUTORS, default="local")
    parser.add_argument("--dryrun", action="store_true", help="Slurm: write and print the sbatch scripts, submit "
                                                              "nothing")
    parser.add_argument("--detach", action="store_true", help="Slurm: return after submitting")
    _evaluation_args(parser)
    parser.add_argument("params", nargs="*", metavar="key=value")
    args = parser.parse_intermixed_args(argv)  # key=value may follow the options
    try:
        if args.family == "report":
            saved = json.loads((args.root / PLAN_FILE).read_text(encoding="utf-8"))
            print(write_report(args.root, saved["phase1_steps"], saved["total_steps"]), end="")
            return 0
        items, options = _split_items(args.params)
        slurm = args.executor == "slurm"
        if not slurm and (args.dryrun or args.detach or options):
            raise ValueError("--dryrun, --detach and executor.KEY=VALUE are for --executor slurm")
        if slurm and (args.no_export or args.text or not args.source or not args.data_path):
            raise ValueError("on Slurm the family needs --source and --data-path as the jobs see them (the twin's "
                             "model and data are made locally: make them, then pass them), and exports both runs")
        root = str(args.root) if slurm else str(args.root.absolute())  # a local task runs in NeMo-Run's folder
        if args.family == "tiny":
            params = _builder_params(detour.tiny_detour, items)  # before any model or data is made
            model = _source_shape(args.source, options) if slurm else None
            source = Path(args.source) if args.source else detour.make_tiny_modernbert(Path(root) / "tiny_modernbert")
            data = Path(args.data_path) if args.data_path else prepare_twin_data(Path(root), args.text, source)
            plan = detour.tiny_detour(str(source), str(data), root, model=model, **params)
        else:
            if not args.source or not args.data_path or args.text:
                raise ValueError(f"{args.family} needs --source and --data-path (prepared with tools/prepare_data.py "
                                 "--tokenizer SOURCE --seq-length 8192 --validation-every K); --text is for the "
                                 "tiny twin")
            params = _builder_params(detour.detour_published, items)
            model = _source_shape(args.source, options) if slurm else None
            plan = detour.detour_published(args.source, args.data_path, root, model=model, **params)
        evaluation = _evaluation(args, plan)
        if slurm:
            launch_family(plan, evaluation, options, dryrun=args.dryrun, detach=args.detach)
            return 0
        print(run_plan(plan, export=not args.no_export, evaluation=evaluation))
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
