"""`python -m recipes`: list, dry-run or launch the registered NeMo-Run recipes.

    python -m recipes --list                     # names and summaries
    python -m recipes --list-markdown            # the table in recipes/README.md (--update-readme rewrites it)
    python -m recipes tiny_clm_mlm               # CPU: 2 torchrun processes through NeMo-Run's LocalExecutor
    python -m recipes tiny_clm_mlm --help        # its parameters, with their types and defaults
    python -m recipes clm_mlm_610m nodes=4 clm_share=0.5 total_steps=22000 --executor slurm --dryrun
    python -m recipes clm_610m total_steps=31500 --then cpt_610m then.steps=10500 --executor slurm
    python -m recipes grid paper --plan          # the paper's 38 runs (= python -m recipes.sweep paper --plan)
    python -m recipes grid mini                  # the mini-replication on CPU, end to end (recipes/mini.py)
    python -m recipes detour tiny --root runs/detour  # domain adaptation: the CLM detour and its control
    python -m recipes eval --model mine=out/mine_hf --smoke --output eval/mine   # fine-tuning grid (Slurm: an array)

Overrides: recipe parameters (`nodes=4`), `executor.KEY=VALUE`, or dotted TrainConfig paths (`optimizer.lr=3e-4`);
`then.`-prefixed ones go to the `--then` recipe, which starts from the first run's final checkpoint.
A local launch checks every data_path first: tiny recipes pack the embedded corpus at their default path, elsewhere
only with --prepare-data, and never into a non-empty directory. A failed task's own error is printed here; a task
that stopped for a preemption after saving exits 75 (run the same command again to resume); one the trainer refused
(an incompatible resume, bad data) prints the trainer's message alone and exits 2. Ctrl-C on a local launch stops it
the same way (save at the next step boundary) and exits 130; a finished run starts nothing and exits 0, or 2 when a
setting that shapes it changed (named; a resume would refuse it too).
"""
from __future__ import annotations

import argparse
import sys

from mlmclm import quiet
from mlmclm.parallel.torchrun import PREEMPTED_EXIT_CODE
from mlmclm.redact import redact
from recipes.interrupt import INTERRUPTED_EXIT_CODE


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(prog="python -m recipes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", nargs="?", help="registered recipe name (see --list)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides (see above)")
    parser.add_argument("--executor", choices=("local", "slurm"), default="local")
    parser.add_argument("--then", metavar="RECIPE", help="a second task starting from this run's final checkpoint")
    parser.add_argument("--dryrun", action="store_true", help="write the launch scripts, submit nothing")
    parser.add_argument("--prepare-data", action="store_true",
                        help="tiny recipes: pack the embedded corpus at data_path when it holds no dataset (at their "
                             "default path this happens anyway); never writes into a non-empty directory")
    parser.add_argument("--detach", action="store_true", help="return after submitting (Slurm)")
    parser.add_argument("--name", help="experiment title (default: the recipe name)")
    parser.add_argument("--list", action="store_true", help="list the registered recipes")
    parser.add_argument("--list-markdown", action="store_true", help="print the recipe table (Markdown)")
    parser.add_argument("--update-readme", action="store_true", help="rewrite the table in recipes/README.md")
    return parser, parser.parse_intermixed_args(argv)


# Families: several tasks from one command, with their own arguments (`python -m recipes FAMILY ... --help`).
FAMILIES = (
    ("grid paper|tiny", "the paper's 38 runs, or their CPU twin: plan, then launch every run (recipes/sweep.py)"),
    ("grid mini", "the mini-replication on CPU: grid, exports, evaluation and report (recipes/mini.py)"),
    ("eval --model L=DIR --output OUT", "the fine-tuning grid over one output folder: locally one command, on "
                                        "Slurm a job array of K tasks x G GPUs (recipes/eval_run.py)"),
    ("detour modernbert|eurobert|tiny|report", "domain adaptation of a HF ModernBERT or EuroBERT as published: "
                                               "import, CLM detour then MLM decay, and its MLM 30 % control, with "
                                               "the held-out loss beside your tasks' scores (--tasks); locally or "
                                               "as one Slurm chain (recipes/detour_run.py)"),
)


def main(argv: list[str] | None = None) -> int:
    quiet.install()
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["grid", "mini"]:  # the mini-replication: the mini grid, then exports, evaluation and report
        from recipes import mini

        return mini.main(argv[2:])
    if argv[:1] == ["grid"]:  # `python -m recipes grid paper|tiny ...`: the paper's whole grid (recipes/sweep.py)
        from recipes import sweep

        return sweep.main(argv[1:])
    if argv[:1] == ["eval"]:  # `python -m recipes eval --model L=DIR ... --output OUT` (recipes/eval_run.py)
        from recipes import eval_run

        return eval_run.main(argv[1:])
    if argv[:1] == ["detour"]:  # `python -m recipes detour tiny|modernbert|eurobert|report ...` (detour_run.py)
        from recipes import detour_run

        return detour_run.main(argv[1:])
    named = [a for a in argv if not a.startswith("-") and "=" not in a]
    if {"-h", "--help"} & set(argv) and named:  # that recipe's parameters, not only the launcher's options
        from recipes import registry
        from recipes.recipe_help import recipe_help

        if named[0] in registry.RECIPES:
            print(recipe_help(named[0]))
            return 0
    parser, args = parse_args(argv)
    from recipes import launch, registry
    if args.name is not None:  # before any folder is made or data packed
        try:
            launch.check_experiment_names(args.name, [], what="--name")
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
    from cluster.executors import settings

    if args.update_readme:
        path = registry.write_readme_table()
        print(f"updated {path}")
        return 0
    if args.list_markdown:
        print(registry.markdown_table(), end="")
        return 0
    if args.list:
        for recipe in registry.RECIPES.values():
            print(f"{recipe.name:<16} {recipe.summary}")
        print("\nFamilies (several tasks from one command; `python -m recipes FAMILY --help`):")
        for command, summary in FAMILIES:
            print(f"  {command:<28} {summary}")
        print(f"\nSlurm settings (environment variables):\n{settings()}")
        return 0
    if not args.recipe:
        parser.error("give a recipe name, or --list")
    first_items = [o for o in args.overrides if not o.startswith("then.")]
    then_items = [o.removeprefix("then.") for o in args.overrides if o.startswith("then.")]
    if then_items and not args.then:
        parser.error("then.* overrides need --then RECIPE")
    try:
        first, overrides = launch.build(args.recipe, first_items)
        tasks = [(args.recipe, first)]
        if args.then:
            second, _ = launch.build(args.then, then_items, extra_params=launch.init_from_param(
                args.then, first))
            tasks.append((args.then if args.then != args.recipe else f"{args.then}-2", launch.chain(first, second)))
        # on Slurm only when asked: the data is then packed here, into a directory the nodes share
        if (args.executor == "local" or args.prepare_data) and not args.dryrun:
            launch.prepare_local_data([args.recipe] + ([args.then] if args.then else []), [t[1] for t in tasks],
                                      prepare=args.prepare_data)
            if note := quiet.kernels_note():
                print(note)
        exp = launch.launch(tasks, args.executor, overrides.executor, title=args.name, dryrun=args.dryrun,
                            detach=args.detach)
    except (ValueError, TypeError) as err:
        print(redact(f"error: {err}"), file=sys.stderr)
        return 2
    except launch.TaskInterruptedError as err:
        print(redact(str(err)), file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    except launch.TaskPreemptedError as err:
        print(redact(str(err)), file=sys.stderr)
        return PREEMPTED_EXIT_CODE
    except launch.TaskRefusedError as err:  # the trainer's own message (an incompatible resume, bad data), once
        print(redact(f"error: {err}"), file=sys.stderr)
        return 2
    except launch.TaskFailedError as err:
        print(redact(f"error: {err}"), file=sys.stderr)
        return 1
    if exp is not None:  # None: every task had already finished, nothing was started
        print(f"experiment directory: {exp._exp_dir}")
    if exp is not None and args.executor == "local" and not args.dryrun:  # a segment's end: no ETA line last
        from recipes.progress import stopped_as_asked

        for _, partial in tasks:
            cfg = partial.config
            if line := stopped_as_asked(cfg.run_dir, cfg.total_steps, cfg.checkpoint.stop_at):
                print(line)
    return 0


if __name__ == "__main__":  # guarded: NeMo-Run re-imports this file's source inside every task
    sys.exit(main())
