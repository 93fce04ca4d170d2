"""Fine-tune and evaluate Hugging Face encoder directories on downstream tasks (docs/evaluation.md).

  python tools/evaluate.py fetch --suite paper --out data/paper     # on a machine with network: every file, once
  python tools/evaluate.py grid --suite paper --list [--data-root data/paper]  # sources, splits, budgets, steps
  python tools/evaluate.py grid --model CLM=out/clm_hf --data-root data/paper --output eval/clm   # the paper suite
  python tools/evaluate.py grid --model CLM=out/clm_hf --smoke --output eval/clm      # the smoke budget (smoke.py)
  python tools/evaluate.py grid --model CLM=out/clm_hf --data-root data/paper --task msmarco --output eval/clm \
      --keep-retriever out/retrievers     # + out/retrievers/CLM/msmarco: SentenceTransformer(...) loads it
  python tools/evaluate.py grid --model CLM=out/clm_hf --tasks tasks.json --output eval/clm
  python tools/evaluate.py curve --run-dir runs/clm --smoke --lrs 1e-4 --seeds 0 --output eval/clm_curve
  python tools/evaluate.py summary --output eval/clm            # rebuild summary.md from the run JSONs
  python tools/evaluate.py grid --model CLM=out/clm_hf --data-root data/paper --output eval/clm --workers 8  # 8 GPUs
  python tools/evaluate.py status eval/clm                       # done / running (by whom, since when) / failed / left
Re-running a command skips runs already finished. Any number of grid commands, on any nodes, may share one --output:
each takes the units nobody holds (docs/evaluation.md, "Many runs at once"). Exit 0: every unit finished; 1: a unit
failed; 2: refused before any unit ran; 75: stopped by SIGTERM/SIGUSR1 (its units given back); 130: Ctrl-C.
"""
from __future__ import annotations

from mlmclm import quiet

quiet.install()  # before anything imports megatron/torch: no TE/apex/CUDA-absent warning walls

import sys

if __name__ == "__main__":  # `grid --workers N --device cpu`: its extra workers import beside this script, not after
    from mlmclm.eval.grid.spawn import start_early

    start_early(sys.argv[1:])

import argparse
import signal
from dataclasses import replace
from pathlib import Path

from mlmclm.eval.checks.smoke import SMOKE_BATCH_SIZE, SMOKE_LEARNING_RATES, SMOKE_MAX_STEPS
from mlmclm.eval.checks.smoke_tasks import write_smoke_tasks
from mlmclm.eval.data.data_root import check_manifest
from mlmclm.eval.data.fetch import FetchError, fetch_suite, manifest_bytes, suite_repos
from mlmclm.eval.finetune.presets import PAPER_TASKS, PRESETS, paper_suite, preset_task
from mlmclm.eval.finetune.protocol import (CUSTOM_MIN_STEPS, PAPER_LEARNING_RATES, PAPER_SEEDS, RUNS_FOLDER,
                                           ProtocolConfig, load_records)
from mlmclm.eval.finetune.device import DEVICE_CHOICES, resolve_device
from mlmclm.eval.finetune.suite_plan import describe_suite
from mlmclm.eval.finetune.task_spec import TaskDataError, load_task_specs
from mlmclm.eval.grid.cost import DEFAULT_MFU, EncoderShape
from mlmclm.eval.grid.run import GridFailed, GridStopped, evaluate_grid
from mlmclm.eval.grid.status import grid_status
from mlmclm.eval.grid.suite_cost import DEFAULT_GPUS, price_suite
from mlmclm.eval.grid.worker import PREEMPTED_EXIT_CODE, PREEMPTION_SIGNALS, Preempted, raise_preempted
from mlmclm.eval.reports.summary import check_summary_replaceable, write_summary
from mlmclm.export.retriever import check_kept_outputs, keep_retrievers
from mlmclm.output_apart import check_output_apart

INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped (training's too)


def _suite(args) -> str:
    """`paper` unless other tasks were asked for (then `custom`)."""
    custom = args.smoke or args.tasks or args.preset
    if args.suite == "paper" and custom:
        raise ValueError("--suite paper runs the paper's tasks; do not combine it with --smoke/--tasks/--preset")
    return args.suite or ("custom" if custom else "paper")


def _tasks(args) -> list:
    if _suite(args) == "paper":
        if args.data_root is not None:  # a folder that does not match the pins is refused before any run starts
            check_manifest(args.data_root, suite_repos(args.task or list(PAPER_TASKS)), args.allow_other_revisions)
        return paper_suite(args.data_root, args.task, args.allow_other_revisions)
    if args.task or args.data_root:
        raise ValueError("--task/--data-root select tasks of the paper suite (--suite paper)")
    specs = []
    if args.smoke:
        specs += write_smoke_tasks(args.output / "smoke_tasks")
    if args.tasks:
        specs += load_task_specs(args.tasks)
    specs += [preset_task(name) for name in args.preset or []]
    if not specs:
        raise ValueError("no tasks: pass --smoke, --tasks FILE.json and/or --preset NAME")
    return specs


def _protocol(args) -> ProtocolConfig:
    protocol = _budgets(args)
    device = getattr(args, "device", None)
    return replace(protocol, device=resolve_device(device)) if device else protocol


def _budgets(args) -> ProtocolConfig:
    if args.smoke and not (args.tasks or args.preset):
        # the smoke tasks alone: the budget they are learnable in at demo size (the paper grid's LRs with one epoch
        # of the ~200 smoke NER rows, 7 steps, left a demo-size model at entity F1 0.00-0.01)
        return ProtocolConfig(learning_rates=tuple(args.lrs or SMOKE_LEARNING_RATES),
                              seeds=tuple(args.seeds or PAPER_SEEDS), batch_size=args.batch_size or SMOKE_BATCH_SIZE,
                              max_steps=SMOKE_MAX_STEPS if args.max_steps is None else args.max_steps,
                              max_epochs=args.max_epochs)
    common = dict(learning_rates=tuple(args.lrs or PAPER_LEARNING_RATES), seeds=tuple(args.seeds or PAPER_SEEDS),
                  batch_size=args.batch_size or 32)
    if _suite(args) == "paper":
        if args.min_steps is not None:
            raise ValueError("the paper suite keeps EncodEval's budgets; --min-steps applies to "
                             "--smoke/--tasks/--preset runs")
        if args.max_epochs is not None:
            raise ValueError("the paper suite fixes the epochs (TC: one full epoch); --max-epochs applies to "
                             "--smoke/--tasks/--preset runs")
        protocol = ProtocolConfig.paper(**common)
        if args.max_steps is not None:  # a smaller step budget for SC/QA/IR (a quick check, not the paper's)
            protocol = ProtocolConfig.paper(
                budgets=tuple((f, args.max_steps if s else None, e) for f, s, e in protocol.budgets),
                task_budgets=tuple((t, args.max_steps if s else None, e) for t, s, e in protocol.task_budgets),
                **common)
        return protocol
    min_steps = CUSTOM_MIN_STEPS if args.min_steps is None else args.min_steps
    return ProtocolConfig(max_steps=1000 if args.max_steps is None else args.max_steps,
                          max_epochs=1 if args.max_epochs is None else args.max_epochs, min_steps=min_steps or None,
                          **common)


def _models(values: list[str]) -> dict[str, Path]:
    """LABEL=DIR pairs, each checked to be a Hugging Face model folder before anything is written (the smoke tasks
    used to land in the output folder before a bad --model was refused)."""
    models = {}
    for value in values:
        label, sep, path = value.partition("=")
        if not sep or not label or not path:
            raise ValueError(f"--model {value!r}: expected LABEL=HF_MODEL_DIR")
        models[label] = Path(path)
        _check_model_dir(value, Path(path))
    return models


def _check_model_dir(value: str, path: Path) -> None:
    if not path.exists():
        raise FileNotFoundError(f"--model {value}: {path} does not exist")
    if (path / "config.json").is_file():
        return
    # a run folder, its checkpoints/ or one iter_* checkpoint: what training writes, not what fine-tuning reads
    from mlmclm.train.checkpoint_files import LATEST_FILE, TRAIN_STATE

    if any((path / name).exists() for name in ("checkpoints", LATEST_FILE, TRAIN_STATE)):
        raise ValueError(f"--model {value}: {path} is a training run, not an exported model; export it first: "
                         f"python tools/convert_to_hf.py {path} OUT, then --model {value.partition('=')[0]}=OUT")
    raise FileNotFoundError(f"--model {value}: {path} is not a Hugging Face model folder (no config.json)")


def _model_shapes(args) -> dict[str, EncoderShape]:
    """--list's models: those of --model, else the paper's three sizes."""
    if args.model:
        return {label: EncoderShape.of_model_dir(path) for label, path in _models(args.model).items()}
    from mlmclm.model.config import PRESETS

    return {name: EncoderShape.of_model_config(PRESETS[name])
            for name in ("eurobert-210m", "eurobert-610m", "eurobert-1b")}


def _grid(args, models: dict[str, Path], tasks: list, protocol: ProtocolConfig) -> int:
    """Runs the grid; the exit code of the contract (docs/evaluation.md)."""
    outcome = evaluate_grid(models, tasks, args.output, protocol, workers=args.workers, threads=args.threads)
    if outcome.stopped == "SIGINT":
        raise KeyboardInterrupt
    if outcome.stopped:
        raise Preempted(outcome.stopped)
    if outcome.records:
        _print_summary(write_summary(outcome.records, args.output, force=args.force))
    print(outcome.spent(protocol.device))
    for line in outcome.lost_workers:
        print(f"lost a worker: {line} (its unit was taken over)")
    if outcome.failed:
        for failure in outcome.failed:
            why = failure["error"].strip().splitlines()[-1:] or ["?"]
            print(f"evaluate: error: {failure['unit']} failed: {why[0]}", file=sys.stderr)
        print(f"evaluate: {len(outcome.failed)} unit(s) failed ({args.output / 'failed'}; `python tools/evaluate.py "
              f"status {args.output}`); the same command runs them once more", file=sys.stderr)
        return 1
    if args.keep_retriever is not None:
        for line in keep_retrievers(outcome.records, models, tasks, protocol, args.keep_retriever):
            print(line)
    return 0


def _saved_runs(output: Path | None) -> str:
    """What an interrupted grid or curve leaves: its finished runs' records (the one in progress is lost)."""
    if output is None:
        return "nothing was saved"
    count = len(list((output / RUNS_FOLDER).glob("*/*/*.json")))
    return f"{count} finished run{'s' * (count != 1)} saved in {output / RUNS_FOLDER}, the one in progress lost"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    grid = commands.add_parser("grid", help="LR x seed grid on each task for each model, then the summary")
    curve = commands.add_parser("curve", help="export + evaluate every checkpoint of a training run")
    summary = commands.add_parser("summary", help="rebuild summary.md / summary.json from existing run JSONs")
    status = commands.add_parser("status", help="where a grid's output folder stands: done, running (by which "
                                                "worker, since when), failed (why), left — across every node")
    status.add_argument("output_dir", type=Path, metavar="OUT")
    fetch = commands.add_parser("fetch", help="download every file the paper suite reads into --out (network; "
                                              "resumable), for --data-root on offline machines")
    fetch.add_argument("--suite", choices=("paper",), default="paper")
    fetch.add_argument("--out", type=Path, required=True)
    fetch.add_argument("--task", action="append", choices=sorted(PAPER_TASKS), help="only these paper tasks")
    for sub in (grid, curve):
        sub.add_argument("--suite", choices=("paper", "custom"),
                         help="paper (default without --smoke/--tasks/--preset): the paper's 13 tasks and protocol")
        sub.add_argument("--data-root", type=Path, help="paper suite offline, from a folder written by `fetch`")
        sub.add_argument("--allow-other-revisions", action="store_true",
                         help="evaluate on a --data-root whose revisions differ from the pinned ones")
        sub.add_argument("--task", action="append", choices=sorted(PAPER_TASKS),
                         help="only these paper tasks (msmarco brings nq and mldr_en)")
        sub.add_argument("--smoke", action="store_true", help="the embedded smoke tasks (offline)")
        sub.add_argument("--tasks", type=Path, help="JSON list of task specs (docs/evaluation.md)")
        sub.add_argument("--preset", action="append", choices=sorted(PRESETS), help="paper task by HF name")
        sub.add_argument("--lrs", type=float, nargs="+",
                         help=f"default: the paper grid {list(PAPER_LEARNING_RATES)}; --smoke alone: "
                              f"{list(SMOKE_LEARNING_RATES)}")
        sub.add_argument("--seeds", type=int, nargs="+", help=f"default: {list(PAPER_SEEDS)}")
        sub.add_argument("--max-steps", type=int,
                         help=f"step cap (default 1000; --smoke alone: {SMOKE_MAX_STEPS}; paper suite: SC/QA/IR "
                              f"budget)")
        sub.add_argument("--max-epochs", type=int, help="custom suites: epoch cap (default 1; --smoke alone: none)")
        sub.add_argument("--min-steps", type=int,
                         help=f"custom suites: at least this many steps per run, repeating a small training set "
                              f"for more epochs (default {CUSTOM_MIN_STEPS}; 0: none; never past --max-steps)")
        sub.add_argument("--batch-size", type=int, help=f"default 32; --smoke alone: {SMOKE_BATCH_SIZE}")
        sub.add_argument("--device", choices=DEVICE_CHOICES, default="auto",
                         help="where the runs compute (default auto: the GPU when there is one)")
    grid.add_argument("--model", action="append", metavar="LABEL=HF_MODEL_DIR")
    grid.add_argument("--keep-retriever", type=Path, metavar="DIR",
                      help="keep each model's fine-tuned retriever (the selected LR's best seed, trained again) as "
                           "a sentence-transformers directory DIR/LABEL/TASK (never overwritten)")
    grid.add_argument("--list", action="store_true",
                      help="print each paper task's source, splits and budget, the steps per model and its GPU-hours "
                           "(per --model given, else the paper's sizes); no download")
    grid.add_argument("--workers", type=int, default=1,
                      help="worker processes on this node (default 1: in this process); on GPUs one per GPU")
    grid.add_argument("--threads", type=int,
                      help="torch threads per worker (default: this node's cores / --workers; one worker: torch's "
                           "default). On CPU a run's numbers depend on its threads: equal threads, equal records")
    grid.add_argument("--gpus", type=int, default=DEFAULT_GPUS, help="--list: the wall time on this many GPUs")
    grid.add_argument("--mfu", type=float, default=DEFAULT_MFU,
                      help=f"--list: the model-FLOPs utilisation assumed for fine-tuning (default {DEFAULT_MFU})")
    curve.add_argument("--run-dir", type=Path, required=True, help="training run folder with checkpoints/iter_*")
    curve.add_argument("--every", type=int, default=1, help="evaluate every N-th checkpoint (the last always)")
    for sub in (grid, curve, summary):
        sub.add_argument("--output", type=Path, required=sub is not grid)
    for sub in (grid, summary):
        sub.add_argument("--force", action="store_true",
                         help="replace a summary.md / summary.json in --output that this tool did not write")
    return parser


def _checkpoint_errors() -> tuple[type[Exception], ...]:
    """The errors of the checkpoint readers, from the modules that define them when this command imported them
    (`curve` reads checkpoints): the other commands never import megatron's checkpoint code (1.5 s of each start,
    which a grid with workers waits for)."""
    defined = (("mlmclm.convert.dist_reader", "CheckpointReadError"), ("mlmclm.train.checkpoint", "CheckpointError"),
               ("mlmclm.train.safe_unpickle", "UnsafeCheckpointError"))
    return tuple(getattr(sys.modules[module], name) for module, name in defined if module in sys.modules)


def _print_summary(markdown_path: Path) -> None:
    """The summary's tables on the console (the full report stays in the file)."""
    print(markdown_path.read_text(encoding="utf-8").rstrip())
    print(f"\n(written to {markdown_path} and {markdown_path.with_suffix('.json')})")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "grid" and not args.list:  # a preemption at any moment: exit 75, not the signal's death
        saved = {signum: signal.signal(signum, raise_preempted) for signum in PREEMPTION_SIGNALS}
    try:
        return _main(args)
    finally:
        if args.command == "grid" and not args.list:
            for signum, handler in saved.items():
                signal.signal(signum, handler)


def _main(args) -> int:
    try:
        if args.command == "fetch":
            manifest = fetch_suite(args.out, args.task or list(PAPER_TASKS))
            print(f"fetched {len(manifest['repos'])} repositories into {args.out}: "
                  f"{manifest_bytes(manifest) / 1e6:.1f} MB on disk; offline: --data-root {args.out}")
        elif args.command == "grid" and args.list:
            if _suite(args) != "paper":
                raise ValueError("--list describes the paper suite (--suite paper)")
            manifest = check_manifest(args.data_root, suite_repos(args.task or list(PAPER_TASKS)),
                                      args.allow_other_revisions) if args.data_root else None
            protocol = _budgets(args)
            print(describe_suite(protocol, args.task, manifest))
            print("\n".join(price_suite(protocol, _model_shapes(args), args.task, manifest, args.gpus, args.mfu)))
        elif args.command == "grid":
            if not args.model or args.output is None:
                raise ValueError("grid needs --model LABEL=HF_MODEL_DIR and --output DIR (or --list)")
            models = _models(args.model)
            inputs = {**{f"model {label}": path for label, path in models.items()}, "data root": args.data_root}
            check_output_apart(args.output, inputs)  # before the smoke tasks or any record is written there
            if args.keep_retriever is not None:
                check_output_apart(args.keep_retriever, inputs)
            if not args.force:
                check_summary_replaceable(args.output)  # someone's summary.md: refused now, not after the grid
            protocol = _protocol(args)  # --device cuda without a GPU: refused here, before anything is written
            if args.workers < 1 or (args.threads is not None and args.threads < 1):
                raise ValueError(f"--workers and --threads must be >= 1, got {args.workers} and {args.threads}")
            tasks = _tasks(args)  # after the checks above: it writes the smoke tasks into --output
            if args.keep_retriever is not None:
                check_kept_outputs(args.keep_retriever, models, tasks)  # refused before hours of fine-tuning
            return _grid(args, models, tasks, protocol)
        elif args.command == "status":
            print(grid_status(args.output_dir))
        elif args.command == "curve":
            from mlmclm.eval.reports.data_efficiency import evaluate_checkpoints

            check_output_apart(args.output, {"training run": args.run_dir, "data root": args.data_root})
            print(evaluate_checkpoints(args.run_dir, _tasks(args), args.output, _protocol(args), every=args.every))
        else:
            records = load_records(args.output)
            if not records:
                raise FileNotFoundError(f"{args.output}: no run JSONs under runs/")
            _print_summary(write_summary(records, args.output, force=args.force))
    except (ValueError, FileNotFoundError, FileExistsError, TaskDataError, ImportError, FetchError,
            *_checkpoint_errors()) as err:
        print(f"evaluate: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # one line, as training's Ctrl-C gives (recipes.interrupt), not a traceback
        kept = ("the files fetched so far are kept" if args.command == "fetch" else
                _saved_runs(getattr(args, "output", None)) + " (finished runs are not run again)")
        newline = "\n" if sys.stderr.isatty() else ""  # off the terminal's ^C and any progress bar's line
        print(f"{newline}evaluate: stopped (Ctrl-C): {kept}; the same command resumes", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    except GridFailed as err:  # `curve`'s grids: a unit failed
        print(f"evaluate: error: a run failed: {err}", file=sys.stderr)
        return 1
    except (Preempted, GridStopped) as stop:  # SIGTERM / SIGUSR1: a preemption; the units in progress given back
        print(f"evaluate: stopped ({stop}): {_saved_runs(args.output)} (its claims removed: any other command takes "
              f"them); the same command resumes", file=sys.stderr)
        return PREEMPTED_EXIT_CODE
    return 0


if __name__ == "__main__":
    sys.exit(main())
