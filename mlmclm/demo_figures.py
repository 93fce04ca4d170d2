"""The README's demo figures, written from what `make demo` measured, and a check that they still are.

`make demo` writes `artifacts/demo/figures.json`. The README's demo paragraph (under "Two commands"), between the
markers below, is `render(figures)`: nothing in it is typed by hand, and every comparison in it ("ahead of",
"level with") is made here from the numbers. CI runs the demo, then `python -m mlmclm.demo_figures check`: a README
whose block differs from the run fails, so a change that moves the demo's numbers must come with the README that says
them.

    python -m mlmclm.demo_figures write   # after `make demo`: put the run's figures into README.md
    python -m mlmclm.demo_figures check   # fail (exit 1, with a diff) when README.md says other numbers

The block ends with a comment naming the CPU the figures were measured on (`cpu_kernels.host()`): the check compares
the paragraph only, and when it differs it names both hosts, so a figure that moves on another machine can be traced.
"""
from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

BEGIN, END = "<!-- demo-figures:begin (python -m mlmclm.demo_figures write) -->", "<!-- demo-figures:end -->"
HOST_PREFIX = "<!-- measured on: "
LEVEL = 1.0  # smoke-score points (of 100) within which two models are called level: one seed resolves no less
TASK_NAMES = {"smoke_speaker_names": ("speaker-name tagging", "entity F1"),
              "smoke_named_character": ('"which character is named?" QA', "F1")}


def _compare(a: float, b: float) -> str:
    gap = 100 * (a - b)
    return "level with" if abs(gap) < LEVEL else ("ahead of" if gap > 0 else "behind")


def render(f: dict) -> str:
    """The paragraph, from the demo's figures.json."""
    val, fm, smoke = f["validation"], f["fill_mask"], f["smoke"]
    clm_end, last, first = (val[k] for k in ("clm_end", "last", "first"))
    below = f["entropy"] - f["train_loss"]["mlm"]
    beat = fm["unigram"]["loss"] - fm["final"]["loss"]
    tasks = []
    spread = max(100 * (max(scores.values()) - min(scores.values())) for scores in smoke.values())
    for task, scores in smoke.items():
        name, metric = TASK_NAMES.get(task, (task, "score"))
        tasks.append(f"{name} ({metric} {100 * scores['random init']:.1f} random / {100 * scores['CLM25']:.1f} CLM "
                     f"/ {100 * scores['CLM25→MLM75']:.1f} final: the CLM-phase export "
                     f"{_compare(scores['CLM25'], scores['random init'])} random init, the final one "
                     f"{_compare(scores['CLM25→MLM75'], scores['random init'])} it)")
    return (
        f"What the demo measured ({f['steps']} steps; the same numbers on every run: fixed seeds, CPU): unigram "
        f"entropy {f['entropy']:.3f} nats/token; CLM loss {f['train_loss']['clm']:.3f}, MLM loss "
        f"{f['train_loss']['mlm']:.3f} (means over the last 10 % of each phase) — **{below:.2f} nats "
        f"{'below' if below > 0 else 'above'} the entropy**"
        + (", so the model uses context, not just word frequencies" if below >= 0.5 else "") + ". "
        f"The held-out works' losses ({f['validation_works']} works; the same samples each time, MLM at 40 % masking "
        f"whatever the phase trains): CLM {first['clm']:.2f} (step {first['step']}) → {clm_end['clm']:.2f} at the "
        f"end of the CLM phase (step {clm_end['step']}) → {last['clm']:.2f} at step {last['step']} while MLM trains; "
        f"MLM-40 % {first['mlm']:.2f} → {clm_end['mlm']:.2f} → {last['mlm']:.2f}. "
        f"On {f['passages']} held-back passages ({f['mask_ratio']:.0%} masked) the masked-token loss is "
        f"{fm['unigram']['loss']:.2f} for training word frequencies alone (unigram, top-1 "
        f"{100 * fm['unigram']['top1']:.1f} %), {fm['random init']['loss']:.2f} (random init) → "
        f"{fm['clm_end']['loss']:.2f} (CLM phase end) → {fm['final']['loss']:.2f} (final), top-1 accuracy "
        f"{100 * fm['random init']['top1']:.1f} % → {100 * fm['clm_end']['top1']:.1f} % → "
        f"{100 * fm['final']['top1']:.1f} %: the final model is {abs(beat):.2f} nats "
        f"{'better' if beat > 0 else 'worse'} than the frequency baseline. "
        f"Smoke fine-tuning ({f['smoke_steps']} steps of 16 at LR {f['smoke_lr']:g}, one seed): "
        + "; ".join(tasks) + f" — one fine-tuning seed each, so none of these differences (up to {spread:.1f} "
        "points) can be called significant.")


def _split(readme: str) -> tuple[str, str, str]:
    if readme.count(BEGIN) != 1 or readme.count(END) != 1:
        raise ValueError(f"README must hold the markers once each: {BEGIN} … {END}")
    head, rest = readme.split(BEGIN)
    block, tail = rest.split(END)
    return head, block, tail


def replace_block(readme: str, paragraph: str, host: str | None = None) -> str:
    head, _, tail = _split(readme)
    note = f"{HOST_PREFIX}{host} -->\n" if host else ""
    return f"{head}{BEGIN}\n{paragraph}\n{note}{END}{tail}"


def block_paragraph_and_host(readme: str) -> tuple[str, str]:
    """The README block's paragraph and the host it names ('not recorded' for a block written before hosts were)."""
    lines = _split(readme)[1].strip("\n").splitlines()
    host = "not recorded"
    if lines and lines[-1].startswith(HOST_PREFIX):
        host = lines.pop().removeprefix(HOST_PREFIX).removesuffix(" -->")
    return "\n".join(lines), host


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlmclm.demo_figures", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("check", "write"))
    parser.add_argument("--readme", type=Path, default=Path("README.md"))
    parser.add_argument("--figures", type=Path, default=Path("artifacts/demo/figures.json"))
    args = parser.parse_args(argv)
    if not args.figures.exists():
        print(f"error: {args.figures} is missing: run `make demo` first", file=sys.stderr)
        return 2
    figures = json.loads(args.figures.read_text())
    readme = args.readme.read_text()
    paragraph, run_host = render(figures), figures.get("host", "not recorded")
    try:
        written, readme_host = block_paragraph_and_host(readme)
    except ValueError as err:
        print(f"error: {args.readme}: {err}", file=sys.stderr)
        return 2
    if args.action == "write":
        args.readme.write_text(replace_block(readme, paragraph, run_host))
        print(f"wrote the demo's figures into {args.readme}")
        return 0
    if written != paragraph:
        diff = difflib.unified_diff(written.splitlines(), paragraph.splitlines(), str(args.readme),
                                    "from the demo run", lineterm="")
        print(f"error: {args.readme}'s demo figures are not what {args.figures} measured; rerun `make demo` and "
              f"`python -m mlmclm.demo_figures write`.\n  README's figures were measured on: {readme_host}\n"
              f"  this run's host:                   {run_host}\n" + "\n".join(diff), file=sys.stderr)
        return 1
    print(f"{args.readme}: the demo figures match {args.figures} (README's from {readme_host}; this run on "
          f"{run_host})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
