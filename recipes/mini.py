"""`python -m recipes grid mini` (`make replicate-mini`): the paper's design at CPU scale, end to end, through the
real grid's code — the sweep (recipes/sweep.py) launches the mini grid (recipes/grid.py `mini_grid`: per
pretraining seed MLM-40 % and CLM from scratch, CLM→MLM branches of the CLM run's stable phase, MLM continued from
both decayed runs) on the tiny recipes; every final checkpoint is exported to Hugging Face EuroBERT; each export
is scored by fill-mask on passages of the held-back work and fine-tuned on the smoke tasks (mlmclm.eval); the
paper report (mlmclm/eval/reports/paper_report.py) draws the figures with 95 % CIs over pretraining seeds.

    python -m recipes grid mini                     # 3 seeds × 7 runs; ~30 min on 2 CPU cores
    python -m recipes grid mini --plan              # the runs, their parents and state; nothing is run
    python -m recipes grid mini --seeds 1 --steps 40 --cpt-steps 8 --smoke-steps 4 --out /tmp/mini   # a quick try

Work (data, runs, exports, evaluation, NeMo-Run logs) goes under --work; a second invocation skips finished runs,
exports and evaluations. The table, figures and report go to --out with the command and its wall time
(`run.json`, `README.md`); an --out that holds anything but this command's own previous output is refused unless
--force. Bad input: exit 2, nothing written.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

from mlmclm import quiet

DEFAULT_WORK, DEFAULT_OUT = "runs/mini", "docs/mini_replication"
RUN_FILE, INDEX_FILE = "run.json", "README.md"
FILL_MASK_RATIO = 0.4  # the paper's (and the runs') mask ratio


def parse_args(argv: list[str]) -> argparse.Namespace:
    from recipes import grid

    parser = argparse.ArgumentParser(prog="python -m recipes grid mini", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(grid.MINI_SEEDS), help="pretraining seeds")
    parser.add_argument("--steps", type=int, default=grid.MINI_STEPS, help="the from-scratch budget (steps)")
    parser.add_argument("--cpt-steps", type=int, default=grid.MINI_CPT_STEPS, help="continued-pretraining steps")
    parser.add_argument("--splits", type=float, nargs="+", default=list(grid.MINI_SPLITS),
                        help="CLM shares of the budget for the CLM→MLM branches")
    parser.add_argument("--mask-schedule", type=float, nargs=2, metavar=("START", "END"), default=None,
                        help="beyond the paper: one more branch per seed at the middle split, its MLM rate falling "
                             "linearly from START to END (e.g. 0.4 0.15), beside the constant-40%% branch")
    parser.add_argument("--smoke-steps", type=int, default=None, help="fine-tuning steps per smoke run (default: "
                        "the smoke budget, 100)")
    parser.add_argument("--passages", type=int, default=None, help="held-back passages for fill-mask (default 60)")
    parser.add_argument("--processes", type=int, default=None, help="ranks per training run (default: the tiny "
                        "recipes' 2); each run's global batch stays 8 sequences whatever the number")
    parser.add_argument("--work", default=DEFAULT_WORK, help="data, runs, exports and evaluation")
    parser.add_argument("--out", default=DEFAULT_OUT, help="the table, figures and report")
    parser.add_argument("--force", action="store_true", help="overwrite an --out that holds other files")
    parser.add_argument("--plan", action="store_true", help="print the runs and their state; run nothing")
    parser.add_argument("--measure-only", action="store_true", help=argparse.SUPPRESS)  # the step after training
    args = parser.parse_args(argv)
    for name in ("steps", "cpt_steps", "smoke_steps", "passages", "processes"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.mask_schedule is not None and not all(0 < r < 1 for r in args.mask_schedule):
        parser.error(f"--mask-schedule rates must be strictly between 0 and 1, got {args.mask_schedule}")
    if any(not 0 < s < 1 for s in args.splits):
        parser.error(f"--splits must be CLM shares strictly between 0 and 1, got {args.splits}")
    return args


def check_out(out: Path, force: bool) -> None:
    """Refuse an --out that is a file, or a folder holding anything but this command's previous output."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder")
    if force or not out.is_dir() or not any(out.iterdir()):
        return
    try:
        ours = json.loads((out / RUN_FILE).read_text(encoding="utf-8")).get("written_by") == "recipes.mini"
    except (OSError, json.JSONDecodeError, AttributeError):
        ours = False
    if not ours:
        raise ValueError(f"--out {out} holds files this command did not write (no {RUN_FILE} of a previous run); "
                         f"choose another folder or pass --force")


class GridProgress(threading.Thread):
    """Every `interval` s: how many runs have finished, and the step of the one training now."""

    def __init__(self, planned, console, interval: float = 30.0):
        super().__init__(daemon=True)
        self.planned, self.console, self.interval = planned, console, interval
        self.done = threading.Event()

    def run(self) -> None:
        from recipes.progress import checkpointed_step

        while not self.done.wait(self.interval):
            steps = [(p, checkpointed_step(p.host_dir) or 0) for p in self.planned]
            finished = sum(step >= p.total_steps for p, step in steps)
            partial = [f"{p.entry.name} at {step}/{p.total_steps}" for p, step in steps if 0 < step < p.total_steps]
            print(f"      {finished}/{len(steps)} runs finished" + (f"; {', '.join(partial)}" if partial else ""),
                  file=self.console, flush=True)

    def stop(self) -> None:
        self.done.set()
        self.join()


def validation_curve(planned_run, by_name) -> list[list[float]]:
    """[step, val CLM, val MLM] of the run's whole history: a branch's steps up to its branch point are its
    parent's (the same steps), a continued run starts (step 0) where its decayed parent ended."""
    from mlmclm.eval.checks.fill_mask import validation_losses

    entry = planned_run.entry
    own = validation_losses(planned_run.host_dir)
    if entry.branch_of:
        parent = validation_losses(by_name[entry.branch_of].host_dir)
        own = {**{s: v for s, v in parent.items() if s <= entry.branch_step},
               **{s: v for s, v in own.items() if s > entry.branch_step}}
    if entry.after:
        parent = validation_losses(by_name[entry.after].host_dir)
        own = {0: parent[max(parent)], **own}
    return [[step, own[step]["val/clm/loss"], own[step]["val/mlm/loss"]] for step in sorted(own)]


def describe(planned_run, by_name) -> dict:
    """What the report needs to know about a run: its objective, schedule and parent (from the grid)."""
    from recipes.grid import seed_label

    entry = planned_run.entry
    phases = dict(planned_run.phases) if len(planned_run.phases) > 1 else {}
    kind = {"tiny_clm": "CLM", "tiny_mlm": "CPT" if entry.after else "MLM", "tiny_clm_mlm": "biphasic"}[entry.recipe]
    clm_steps = {"CLM": planned_run.total_steps, "MLM": 0, "CPT": 0}.get(kind, phases.get("clm"))
    seed = entry.params["seed"]
    base = entry.name.removesuffix(seed_label("", seed))
    parent = None
    if entry.after:
        parent_run = by_name[entry.after]
        parent = {"label": entry.after, "objective": describe(parent_run, by_name)["objective"]}
    variant = None
    if entry.params.get("mask_schedule", "constant") != "constant":
        variant = (f"mask {entry.params['mask_ratio']:.0%} → {entry.params['mask_ratio_end']:.0%} "
                   f"{entry.params['mask_schedule']}")
    return {"label": entry.name, "base": base, "seed": seed, "objective": kind, "variant": variant,
            "total_steps": planned_run.total_steps,
            "clm_steps": clm_steps, "parent": parent, "branch_of": entry.branch_of, "branch_step": entry.branch_step}


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TQDM_DISABLE", "1")  # the fine-tuning loops' step bars: the stages say enough here
    quiet.install()
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    started = time.time()
    console = sys.stdout
    command = "python -m recipes grid mini" + "".join(f" {shlex.quote(a)}" for a in argv)
    work, out = Path(args.work).resolve(), Path(args.out)
    from recipes import launch, sweep

    options = {"steps": args.steps, "cpt_steps": args.cpt_steps, "seeds": tuple(args.seeds),
               "splits": tuple(args.splits),
               "mask_schedule": None if args.mask_schedule is None else tuple(args.mask_schedule)}
    try:
        check_out(out, args.force)
        planned = sweep.build_plan("mini", run_root=str(work / "runs"), data_path=str(work / "data"),
                                   grid_options=options,
                                   params=None if args.processes is None else {"processes": args.processes})
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.measure_only:
        return measure_and_evaluate(planned, work, args, console)
    print(sweep.plan_table(planned, sweep.DEFAULT_MFU, sweep.DEFAULT_PEAK).rsplit("\n", 1)[0], file=console)
    if args.plan:
        return 0
    try:
        trained = pretrain(planned, work, console)
    except launch.TaskFailedError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    # Export, fill-mask and fine-tuning in a fresh process. Fine-tuning in this one once ran many times slower after
    # the NeMo-Run launches; a later check pointed at the machine's load, not state left here, so the split is a
    # precaution, not a measured need.
    measured = subprocess.run([sys.executable, "-m", "recipes.mini", *argv, "--measure-only"], check=False)
    if measured.returncode:
        return measured.returncode
    print(f"[5/5] the paper report over pretraining seeds → {out}", file=console)
    from mlmclm.eval.reports.paper_report import ReportInputError, write_report
    from mlmclm.eval.reports.pretraining_runs import PRETRAINING_FILE

    try:
        check_out(out, args.force)  # again: someone may have written there while the runs trained
        report = write_report([work / "eval"], out, force=True)
    except (ReportInputError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    wall = time.time() - started
    write_index(out, command, wall, trained, len(planned),
                json.loads((work / "eval" / PRETRAINING_FILE).read_text(encoding="utf-8")), report)
    print(f"done in {wall / 60:.1f} min: {out / INDEX_FILE}", file=console)
    return 0


def measure_and_evaluate(planned, work: Path, args, console) -> int:
    """Steps 3 and 4 (run by `main` in a child process): exports, fill-mask, validation curves, smoke fine-tuning."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    unfinished = [p.entry.name for p in planned if not p.finished]
    if unfinished:
        print(f"error: not finished: {unfinished}", file=sys.stderr)
        return 1
    exports = export_all(planned, work, console)
    measure(planned, exports, work, args, console)
    evaluate(exports, work, args, console)
    return 0


def pretrain(planned, work: Path, console) -> int:
    """Pack the corpus (held-back work out, every 8th work the validation split), then the sweep's local launch of
    every unfinished run; returns how many runs trained now."""
    from mlmclm.data.tokenizer import load_tokenizer
    from recipes.demo import VALIDATION_EVERY
    from mlmclm.eval.checks.fill_mask import corpus_split
    from recipes import launch, sweep
    from recipes.tiny import prepare_tiny_data

    train_tokens, held_back, _ = corpus_split(load_tokenizer("embedded"), VALIDATION_EVERY)
    print(f"[1/5] the embedded corpus, {held_back.title!r} held back, every {VALIDATION_EVERY}th work for "
          f"validation → {work / 'data'}", file=console)
    prepare_tiny_data(str(work / "data"), max_tokens=train_tokens, validation_every=VALIDATION_EVERY)
    runs = sweep.to_launch(planned)
    log = work / "nemo_run.log"
    print(f"[2/5] pretraining {len(runs)} of {len(planned)} runs through the sweep (NeMo-Run's log: {log})",
          file=console)
    if not runs:
        return 0
    progress = GridProgress(planned, os.fdopen(os.dup(1), "w"))
    progress.start()
    try:
        with launch._console_to(log):
            sweep.launch_plan(runs, "local", {"gpus": False}, title="mini-replication",
                              base_dir=str(work / "nemo_experiments"))
    finally:
        progress.stop()
    return len(runs)


def export_all(planned, work: Path, console) -> dict[str, Path]:
    """Each run's final checkpoint as a Hugging Face EuroBERT (kept when already exported), and a random-initialised
    model of the same shape as the baseline."""
    from mlmclm.convert.to_hf import export_checkpoint
    from recipes.demo import random_baseline
    from mlmclm.train.checkpoint_files import latest_checkpoint

    print(f"[3/5] exporting {len(planned)} final checkpoints to Hugging Face EuroBERT → {work / 'hf'}", file=console)
    exports = {}
    for p in planned:
        target = work / "hf" / p.entry.name
        exports[p.entry.name] = target if (target / "config.json").exists() else \
            export_checkpoint(latest_checkpoint(p.host_dir / "checkpoints"), target)
    return {"random-init": random_baseline(next(iter(exports.values())), work / "hf" / "random-init"), **exports}


def measure(planned, exports: dict[str, Path], work: Path, args, console) -> dict:
    """Fill-mask on the held-back passages (and the unigram baseline), the validation curves and what each run is:
    written to the evaluation folder's pretraining.json, which the report reads."""
    from transformers import AutoTokenizer

    from mlmclm.data.tokenizer import load_tokenizer
    from recipes.demo import HELD_BACK_PASSAGES, VALIDATION_EVERY
    from mlmclm.eval.checks.fill_mask import (corpus_split, fill_mask_scores, held_back_passages,
                                              unigram_fill_mask_scores)
    from mlmclm.eval.reports.pretraining_runs import write_pretraining

    _, held_back, counts = corpus_split(load_tokenizer("embedded"), VALIDATION_EVERY)
    passages = held_back_passages(held_back.text, args.passages or HELD_BACK_PASSAGES)
    print(f"[4/5] fill-mask ({FILL_MASK_RATIO:.0%} masked) on {len(passages)} passages of {held_back.title!r}",
          file=console)
    tokenizer = AutoTokenizer.from_pretrained(next(iter(exports.values())), trust_remote_code=False)
    loss, top1 = unigram_fill_mask_scores(tokenizer, counts, passages, FILL_MASK_RATIO)
    baselines = {"unigram": {"loss": loss, "top1": top1}}
    loss, top1 = fill_mask_scores(exports["random-init"], passages, FILL_MASK_RATIO)
    baselines["random-init"] = {"loss": loss, "top1": top1}
    by_name = {p.entry.name: p for p in planned}
    runs = []
    for p in planned:
        loss, top1 = fill_mask_scores(exports[p.entry.name], passages, FILL_MASK_RATIO)
        runs.append({**describe(p, by_name), "validation": validation_curve(p, by_name),
                     "fill_mask": {"loss": loss, "top1": top1}})
    measured = {"mask_ratio": FILL_MASK_RATIO, "passages": len(passages), "held_back": held_back.title,
                "baselines": baselines, "runs": runs}
    write_pretraining(work / "eval", measured)
    return measured


def evaluate(exports: dict[str, Path], work: Path, args, console) -> Path:
    from recipes.demo import DEMO_SMOKE_TASKS
    from mlmclm.eval.checks.smoke import SMOKE_MAX_STEPS, run_smoke_evaluation

    steps = args.smoke_steps or SMOKE_MAX_STEPS
    print(f"      fine-tuning {len(exports)} models on {', '.join(DEMO_SMOKE_TASKS)} ({steps} steps, 1 seed each)",
          file=console)
    return run_smoke_evaluation(exports, work / "eval", seeds=(0,), progress=False, tasks=DEMO_SMOKE_TASKS,
                                max_steps=steps)


def write_index(out: Path, command: str, wall: float, trained: int, total: int, measured: dict,
                report: Path) -> None:
    """run.json (what ran, how long) and README.md: the command, its wall time, the table over seeds, the figures."""
    from mlmclm.eval.reports.paper_report import SEEDS_TABLE_MD

    seeds = sorted({r["seed"] for r in measured["runs"]})
    facts = {"written_by": "recipes.mini", "command": command, "wall_time_s": round(wall, 1),
             "runs": total, "trained_now": trained, "seeds": seeds, "cpu_count": os.cpu_count(),
             "finished": time.strftime("%Y-%m-%d %H:%M:%S %z")}
    (out / RUN_FILE).write_text(json.dumps(facts, indent=1) + "\n", encoding="utf-8")
    figures = sorted(p.name for p in out.glob("*.png"))
    lines = ["# Mini-replication (generated)", "",
             f"Command: `{command}` — wall time {wall / 60:.1f} min on {os.cpu_count()} CPU cores "
             f"({trained} of {total} runs trained by this invocation; the others were already finished), "
             f"finished {facts['finished']}.", "",
             f"Pretraining seeds: {', '.join(map(str, seeds))}; fill-mask on "
             f"{measured['passages']} passages of {measured['held_back']!r} at {measured['mask_ratio']:.0%} masking; "
             f"unigram baseline top-1 {100 * measured['baselines']['unigram']['top1']:.1f} %, random init "
             f"{100 * measured['baselines']['random-init']['top1']:.1f} %.", "",
             "## Over pretraining seeds (mean ± 95 % CI)", "", (out / SEEDS_TABLE_MD).read_text(encoding="utf-8"),
             "## Figures", ""] + [f"![{name}]({name})" for name in figures] + ["", f"Full report: [{report.name}]"
                                                                             f"({report.name})."]
    (out / INDEX_FILE).write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":  # the measuring step runs as `python -m recipes.mini ... --measure-only`
    sys.exit(main())
