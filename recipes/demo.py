"""`make demo`: the main job end to end on the embedded corpus, on CPU, offline — and what it learned.

1. pack the embedded corpus (all works but one, held back) with the embedded tokenizer, every 8th work as the
   validation split; the training text's unigram entropy is the loss of a model that knows word frequencies and
   nothing else;
2. train a tiny EuroBERT with the `tiny_clm_mlm` recipe on 2 torchrun processes (data parallel, distributed
   optimizer, over gloo) through NeMo-Run's local executor: CLM for the first 25 % of the steps, then MLM; the
   validation split's CLM and MLM losses every 25 steps, whatever the phase;
3. export the CLM phase-end and the final checkpoints to Hugging Face EuroBERT, plus a random-initialised model of
   the same shape as the baseline;
4. fill-mask on lines of the held-back work: masked-token loss of the three models, and a few examples;
5. fine-tune the three on the embedded smoke tasks and compare them; plots in OUTPUT/plots.png.
NeMo-Run's own console output goes to OUTPUT/nemo_run.log; a failed task's error is printed here.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from mlmclm import cpu_kernels

# before torch computes anything here or in the training processes: one path per library (mlmclm/cpu_kernels.py)
cpu_kernels.pin()
from mlmclm import quiet  # noqa: E402
# shared with the mini-replication; imported here under the names the demo has always used
from mlmclm.eval.checks.fill_mask import (corpus_split, fill_mask_scores, held_back_passages,  # noqa: E402, F401
                                          load_mlm, masked_positions, unigram_entropy, unigram_fill_mask_scores,
                                          validation_losses)

DEMO_STEPS = 400
CLM_SHARE = 0.25
# Chosen for learning per second on 2 CPU cores (see the README): data parallel (no per-layer TP all-reduce over
# gloo), 8 sequences per step in one micro batch of 4 per rank (more updates beat bigger batches this early), a
# tiny model's learning rate, BERT's 15 % masking (the recipe's default is the paper's 40 %, slower to learn at this
# size), and the WSD decay over the whole MLM phase.
DEMO_OVERRIDES = ("tensor_parallel=1", "global_batch_size=8", "micro_batch_size=4", "optimizer.lr=2e-3",
                  "mask_ratio=0.15", f"clm_share={CLM_SHARE}")
HELD_BACK_PASSAGES = 60  # passages of 6 lines of the held-back work scored by fill-mask
VALIDATION_EVERY = 8  # every 8th work (4 of the 41 training works) is the validation split
# Smoke tasks the demo's models learn within the smoke budget (mlmclm/eval/checks/smoke.py). smoke_which_play and
# smoke_speech_halves stay at chance for every model at this size (4 layers, 128 wide, 400 steps): they are left to
# `tools/evaluate.py grid --smoke`, where they check that the classification and retrieval paths run.
DEMO_SMOKE_TASKS = ("smoke_speaker_names", "smoke_named_character")


def _say(console, text: str = "") -> None:
    console.write(text + "\n")
    console.flush()


def phase_losses(run_dir: Path, share: float = 0.1) -> dict[str, float]:
    """Each objective's mean loss over the last `share` of its steps (one step's loss is noisy at this batch)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    by_phase: dict[str, list[float]] = {}
    for row in rows:
        by_phase.setdefault(row["phase"], []).append(row[f"train/{row['phase']}/loss"])
    return {phase: sum(v[-max(1, int(len(v) * share)):]) / max(1, int(len(v) * share))
            for phase, v in by_phase.items()}


def random_baseline(like: Path, target: Path, seed: int = 0) -> Path:
    """A randomly initialised EuroBERT with the exported models' config and tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer

    if (target / "config.json").exists():
        return target
    torch.manual_seed(seed)
    model = AutoModelForMaskedLM.from_config(AutoConfig.from_pretrained(like, trust_remote_code=False))
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(like, trust_remote_code=False).save_pretrained(target)
    return target


def fill_mask_examples(model_dir: Path, passages: list[str], top: int = 3) -> list[str]:
    """One whole word masked in the middle line of each passage: that line, the truth and the top predictions."""
    import torch

    tokenizer, model = load_mlm(model_dir)
    out = []
    for passage in passages:
        lines = passage.split("\n")
        half = len(lines) // 2
        before, line = "\n".join(lines[:half]) + "\n", lines[half]
        start = len(tokenizer(before, add_special_tokens=False)["input_ids"])
        ids = tokenizer(passage, add_special_tokens=False)["input_ids"][:128]
        end = start + len(tokenizer(line, add_special_tokens=False)["input_ids"])
        words = [i for i in range(start + 1, min(end, len(ids)))
                 if tokenizer.decode([ids[i]]).startswith(" ") and tokenizer.decode([ids[i]]).strip().isalpha()
                 and len(tokenizer.decode([ids[i]]).strip()) >= 3]
        if not words:
            continue
        pos = words[len(words) // 2]
        masked = list(ids)
        masked[pos] = tokenizer.mask_token_id
        with torch.no_grad():
            best = model(input_ids=torch.tensor([masked])).logits[0, pos].topk(top).indices.tolist()
        shown = tokenizer.decode(ids[start:pos]) + " ____" + tokenizer.decode(ids[pos + 1:end])
        guesses = ", ".join(repr(tokenizer.decode([b])) for b in best)
        out.append(f"      {shown.strip()}\n        truth {tokenizer.decode([ids[pos]]).strip()!r}; top {top}: {guesses}")
    return out


PIPELINE_QUERIES = ("Now is the winter of our <|mask|>.", "To be, or not to be, that is the <|mask|>:",
                    "O Romeo, Romeo, wherefore art thou <|mask|>?")


def pipeline_examples(model_dir: Path, queries=PIPELINE_QUERIES, top: int = 3) -> list[str]:
    """Hugging Face's own `pipeline("fill-mask")` on the export, queried as a user would type it."""
    from transformers import pipeline

    fill = pipeline("fill-mask", model=str(model_dir), tokenizer=str(model_dir), top_k=top, trust_remote_code=False)
    return [f"      {query!r}: " + ", ".join(f"{guess['token_str']!r} {guess['score']:.2f}" for guess in fill(query))
            for query in queries]


def plot(run_dir: Path, entropy: float, smoke: dict[str, dict[str, float]], target: Path,
         fill_mask: dict[str, float] | None = None) -> Path:
    """Left: training loss per step, the validation losses, the unigram entropy. Middle: fill-mask loss on the
    held-back passages per model. Right: smoke test scores per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(16, 4.5), gridspec_kw={"width_ratios": [5, 2, 4]})
    for phase in ("clm", "mlm"):
        points = [(r["step"], r[f"train/{phase}/loss"]) for r in rows if r["phase"] == phase]
        if points:
            left.plot(*zip(*points), label=f"{phase.upper()} loss", lw=0.8)
    for kind, style in (("clm", "o-"), ("mlm", "s-")):
        held_out = [(step, v[f"val/{kind}/loss"]) for step, v in validation_losses(run_dir).items()]
        if held_out:
            left.plot(*zip(*held_out), style, ms=3, lw=1, label=f"validation {kind.upper()}")
    left.axhline(entropy, color="k", ls="--", lw=1, label=f"unigram entropy {entropy:.2f}")
    left.set_xlabel("step"), left.set_ylabel("nats per predicted token"), left.set_ylim(top=max(entropy + 2, 7))
    left.set_title("training loss; held-out CLM and MLM-40 % loss (word frequencies alone: the dashed line)")
    left.title.set_fontsize(9)
    left.legend(fontsize=8)
    fill_mask = fill_mask or {}
    # the unigram bar grey, the models in the smoke panel's colours
    colours = ["0.6" if label == "unigram" else f"C{list(smoke).index(label)}" if label in smoke else "C7"
               for label in fill_mask]
    middle.bar(range(len(fill_mask)), list(fill_mask.values()), color=colours)
    middle.set_xticks(range(len(fill_mask)), list(fill_mask), rotation=20, fontsize=8)
    middle.set_ylabel("masked-token loss (nats)"), middle.set_title("fill-mask, held-back work (lower is better)")
    middle.title.set_fontsize(9)
    models, tasks = list(smoke), sorted({t for scores in smoke.values() for t in scores})
    width = 0.8 / max(1, len(models))
    for i, model in enumerate(models):
        right.bar([j + i * width for j in range(len(tasks))], [100 * smoke[model].get(t, 0) for t in tasks], width,
                  label=model)
    right.set_xticks([j + width * (len(models) - 1) / 2 for j in range(len(tasks))],
                     [t.removeprefix("smoke_") for t in tasks])
    right.set_ylabel("test score (%)"), right.set_title("smoke tasks after fine-tuning (1 LR, 1 seed)")
    right.set_ylim(0, 115)  # room for the legend above the bars, which reach 100
    right.title.set_fontsize(9)
    right.legend(fontsize=8, loc="upper center", ncol=len(models))
    fig.tight_layout()
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recipes.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="artifacts/demo", help="where data, run, exports and eval go")
    parser.add_argument("--steps", type=int, default=DEMO_STEPS)
    parser.add_argument("--skip-eval", action="store_true", help="stop after the fill-mask scores")
    parser.add_argument("--smoke-steps", type=int, default=None,
                        help="fine-tuning steps per smoke run (default: the smoke budget, 100; tests use fewer)")
    args = parser.parse_args(argv)
    if args.smoke_steps is not None and args.smoke_steps < 1:
        parser.error(f"--smoke-steps must be >= 1, got {args.smoke_steps}")
    quiet.install()
    os.environ.setdefault("TQDM_DISABLE", "1")  # the fine-tuning loops' step bars: the stages say enough here
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    out = Path(args.output).resolve()
    started = time.time()
    console = sys.stdout

    from mlmclm.data.tokenizer import load_tokenizer
    from recipes.interrupt import INTERRUPTED_EXIT_CODE
    from recipes.launch import TaskFailedError, TaskInterruptedError, build, launch
    from recipes.progress import RunProgress
    from recipes.tiny import prepare_tiny_data

    tokenizer = load_tokenizer("embedded")
    train_tokens, held_back, counts = corpus_split(tokenizer, VALIDATION_EVERY)
    entropy = unigram_entropy(counts)
    _say(console, f"[1/5] packing the embedded corpus (all works but {held_back.title!r}, held back) → {out / 'data'}")
    from mlmclm.data.manifest import Manifest

    manifest = Manifest.load(str(prepare_tiny_data(str(out / "data"), max_tokens=train_tokens,
                                                   validation_every=VALIDATION_EVERY)))
    _say(console, f"      {manifest.num_samples} sequences of {manifest.seq_length} tokens ({manifest.num_tokens} "
                  f"tokens); unigram entropy {entropy:.3f} nats/token; validation split: every "
                  f"{VALIDATION_EVERY}th work, {manifest.validation['num_documents']} works, "
                  f"{manifest.validation['num_tokens']} tokens")

    run_dir = out / "run"
    log_file = out / "nemo_run.log"
    mlm_steps = args.steps - round(args.steps * CLM_SHARE)
    partial, _ = build("tiny_clm_mlm", [f"steps={args.steps}", *DEMO_OVERRIDES, f"schedule.decay_steps={mlm_steps}",
                                        f"data_path={out / 'data'}", f"run_dir={run_dir}",
                                        "logging.run_name=demo"])
    cfg = partial.config
    _say(console, f"[2/5] recipe tiny_clm_mlm: {cfg.model.num_layers}-layer EuroBERT (hidden {cfg.model.hidden_size}), "
                  f"CLM {CLM_SHARE:.0%} → MLM (mask {cfg.phases[1].objective.mask_ratio:.0%}) of {args.steps} steps × "
                  f"{cfg.global_batch_size} sequences, 2 torchrun processes through NeMo-Run's local executor "
                  f"(its log: {log_file})")
    # says whether the run directory already holds this run (then reused: its figures below are that run's)
    progress = RunProgress(run_dir, args.steps, os.fdopen(os.dup(1), "w"), prefix="      ", summary=False)
    progress.start()
    try:
        launch([("tiny_clm_mlm", partial)], "local", base_dir=str(out / "nemo_experiments"), console_log=log_file,
               progress=False)
    except TaskInterruptedError as err:  # Ctrl-C: the run saved (recipes.interrupt); `make demo` again resumes it
        print(f"{err}\n(make demo again resumes the training and redoes the later stages)", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
    except TaskFailedError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        progress.stop()
    losses = phase_losses(run_dir)
    _say(console, f"      loss over the last 10 % of each phase: CLM {losses['clm']:.3f}, MLM {losses['mlm']:.3f}; "
                  f"unigram entropy {entropy:.3f} → MLM {entropy - losses['mlm']:+.3f} nats below it"
                  f" (the demo's bar for using context, not just word frequencies: ≥ 0.5 nats; "
                  f"{'met' if entropy - losses['mlm'] >= 0.5 else 'NOT met'})")
    from mlmclm.train.config import ValidationConfig

    held_out = validation_losses(run_dir)
    figures = {"steps": args.steps, "entropy": entropy, "train_loss": losses,
               "validation_works": manifest.validation["num_documents"],
               "validation": {name: {"step": step, "clm": held_out[step]["val/clm/loss"],
                                     "mlm": held_out[step]["val/mlm/loss"]}
                              for name, step in (("first", min(held_out)), ("last", max(held_out)),
                                                 ("clm_end", round(args.steps * CLM_SHARE)))}}
    _say(console, f"      validation on the held-out works (the same samples each time; MLM at "
                  f"{ValidationConfig().mask_ratio:.0%} masking, whatever the phase trains):")
    shown = set(sorted(held_out)[::max(1, len(held_out) // 6)]) | {round(args.steps * CLM_SHARE), args.steps}
    for step in sorted(shown & set(held_out)):   # a few, the CLM phase end and the last
        _say(console, f"        step {step:>4}: CLM {held_out[step]['val/clm/loss']:.3f}, "
                      f"MLM {held_out[step]['val/mlm/loss']:.3f}")
    _say(console, f"      TensorBoard: tensorboard --logdir {run_dir / 'tensorboard'} (runs demo, demo/clm, "
                  f"demo/mlm; tabs: Time Series, opening on the losses; Custom Scalars for both objectives and the "
                  f"validation on one chart, a colour each; Text for the config and the phase switch)")

    _say(console, "[3/5] exporting to Hugging Face EuroBERT: CLM phase end, final, and a random-initialised baseline")
    from mlmclm.convert.to_hf import export_checkpoint
    from mlmclm.train.checkpoint_files import TRAIN_STATE, latest_checkpoint

    final = latest_checkpoint(run_dir / "checkpoints")
    states = {p: json.loads((p / TRAIN_STATE).read_text()) for p in (run_dir / "checkpoints").glob("iter_*")}
    clm_end = next(p for p, s in states.items() if s.get("keep") and s.get("phase_name") == "clm")
    exports = {}
    for label, checkpoint in (("CLM25", clm_end), ("CLM25→MLM75", final)):
        target = out / "hf" / checkpoint.name
        exports[label] = export_checkpoint(checkpoint, target) if not target.exists() else target
    exports = {"random init": random_baseline(exports["CLM25→MLM75"], out / "hf" / "random_init"), **exports}
    for label, directory in exports.items():
        _say(console, f"      {label:<12} {directory}")

    mask_ratio = cfg.phases[1].objective.mask_ratio
    lines = held_back_passages(held_back.text, HELD_BACK_PASSAGES)
    _say(console, f"[4/5] fill-mask on {len(lines)} held-back passages of {held_back.title!r} ({mask_ratio:.0%} of "
                  f"tokens masked; unigram entropy {entropy:.2f}):")
    from transformers import AutoTokenizer

    # the one fill_mask_scores uses
    exported_tokenizer = AutoTokenizer.from_pretrained(exports["CLM25→MLM75"], trust_remote_code=False)
    loss, accuracy = unigram_fill_mask_scores(exported_tokenizer, counts, lines, mask_ratio)
    fill_mask_losses = {"unigram": loss}
    figures.update(passages=len(lines), mask_ratio=mask_ratio, fill_mask={"unigram": {"loss": loss, "top1": accuracy}})
    _say(console, f"      {'unigram':<12} masked-token loss {loss:.2f} nats, top-1 accuracy {accuracy:.1%}   (training "
                  f"word frequencies only: the bar to beat)")
    for label, directory in exports.items():
        loss, accuracy = fill_mask_scores(directory, lines, mask_ratio)
        fill_mask_losses[label] = loss
        figures["fill_mask"][{"CLM25": "clm_end", "CLM25→MLM75": "final"}.get(label, label)] = {"loss": loss,
                                                                                              "top1": accuracy}
        _say(console, f"      {label:<12} masked-token loss {loss:.2f} nats, top-1 accuracy {accuracy:.1%}")
    _say(console, "      examples (CLM25→MLM75):")
    for example in fill_mask_examples(exports["CLM25→MLM75"], lines[:4]):
        _say(console, example)
    _say(console, "      through Hugging Face: pipeline('fill-mask', model=<export>), top 3 with their probabilities:")
    for example in pipeline_examples(exports["CLM25→MLM75"]):
        _say(console, example)

    if args.skip_eval:
        _say(console, f"done in {time.time() - started:.0f} s")
        return 0
    from mlmclm.eval.checks.smoke import SMOKE_LEARNING_RATES, SMOKE_MAX_STEPS, run_smoke_evaluation
    from mlmclm.eval.checks.smoke_tasks import SmokeSizes
    from mlmclm.eval.finetune.protocol import load_records

    sizes = SmokeSizes()
    smoke_steps = args.smoke_steps if args.smoke_steps is not None else SMOKE_MAX_STEPS
    _say(console, f"[5/5] fine-tuning the three on smoke tasks ({', '.join(DEMO_SMOKE_TASKS)}; {smoke_steps} steps "
                  f"of 16 at LR {SMOKE_LEARNING_RATES[0]:g}, 1 seed; validation {sizes.validation}, test {sizes.test} "
                  f"examples)")
    summary = run_smoke_evaluation(exports, out / "eval", seeds=(0,), tasks=DEMO_SMOKE_TASKS,
                                   max_steps=smoke_steps)
    scores: dict[str, dict[str, float]] = {label: {} for label in exports}
    metric = {}
    for record in load_records(summary.parent):
        if record.model in scores:
            scores[record.model][record.task] = record.test_score
            metric[record.task] = record.main_metric
    _say(console, "      " + f"{'task (test)':<34}" + "".join(f"{label:>14}" for label in exports))
    for task in sorted(metric):
        _say(console, "      " + f"{task + ' ' + metric[task]:<34}"
                      + "".join(f"{100 * scores[label].get(task, float('nan')):>14.1f}" for label in exports))
    figure = plot(run_dir, entropy, scores, out / "plots.png", fill_mask_losses)
    figures.update(smoke_steps=smoke_steps, smoke_lr=SMOKE_LEARNING_RATES[0], host=cpu_kernels.host(),
                   smoke={task: {label: scores[label][task] for label in exports} for task in sorted(metric)})
    (out / "figures.json").write_text(json.dumps(figures, indent=1, ensure_ascii=False))  # the README's numbers
    _say(console, f"      summary {summary}; plots {figure}")
    _say(console, f"done in {time.time() - started:.0f} s")
    return 0


def interruptible_main(argv: list[str] | None = None) -> int:
    """Ctrl-C outside the training (packing, export, fill-mask, fine-tuning: all in this process) ends the demo
    without a traceback; a finished training run is reused by the next `make demo`."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        print("\nstopped (Ctrl-C); make demo again reuses the finished stages' run and redoes the rest",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(interruptible_main())
