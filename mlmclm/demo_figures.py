"""The README's demo figures, written from what `make demo` measured, and a check that they still are.

`make demo` writes `artifacts/demo/figures.json`. The README's demo paragraph (under "Two commands"), between the
markers below, is `render(figures)`: nothing in it is typed by hand, and every comparison in it ("ahead of",
"level with") is made here from the numbers. `write` also keeps those figures at full precision in
`docs/demo_figures.json`, the reference a run on another CPU is measured against.

    python -m mlmclm.demo_figures write   # after `make demo`: put the run's figures into README.md
    python -m mlmclm.demo_figures check   # fail (exit 1) when this run's figures are not the README's

The figures are the same on every run on one host, but not across CPU vendors (mlmclm/cpu_kernels.py: measured on an
Intel Xeon and two AMD EPYC generations). So `check` is exact on the host the README names (the comment closing its
block, `cpu_kernels.host()`): the paragraph must be the same to the letter. On any other host each figure must lie
within SPREAD of the reference, and a failure names only the figures outside it. CI runs the demo, then `check`.
"""
from __future__ import annotations

import argparse
import difflib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

BEGIN, END = "<!-- demo-figures:begin (python -m mlmclm.demo_figures write) -->", "<!-- demo-figures:end -->"
HOST_PREFIX = "<!-- measured on: "
LEVEL = 1.0  # smoke-score points (of 100) within which two models are called level: one seed resolves no less
TASK_NAMES = {"smoke_speaker_names": ("speaker-name tagging", "entity F1"),
              "smoke_named_character": ('"which character is named?" QA', "F1")}

# How far a figure may move from the README's on another CPU host, by the unit it is in. Measured at 5708c97 between
# an Intel Xeon (family 6 model 207) and AMD EPYC (family 25 model 17 and family 26 model 2, equal to each other):
# losses 0 to 0.15 nats apart, top-1 0.7 points, smoke F1 up to 8.1 points (one fine-tuning seed of 100 steps from
# weights that differ in their last bits: the most chaotic figure). Each bound is about twice the spread seen, so a
# third host passes while a broken demo (a loss off by a quarter nat, a task at chance) does not.
SPREAD = {"nats": 0.25, "top-1": 0.03, "F1": 0.20}
SKIPPED = {"host"}


def _unit(path: tuple[str, ...]) -> str | None:
    """The SPREAD unit of a figure, or None for one that no host may move (counts, steps, data-only figures)."""
    head, last = path[0], path[-1]
    if head == "train_loss" or (head == "validation" and last != "step"):
        return "nats"
    if head == "fill_mask" and path[1] != "unigram":  # the unigram baseline is counted from the data alone
        return "nats" if last == "loss" else "top-1"
    if head == "smoke":
        return "F1"
    return None


def _leaves(figures: dict, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], object]:
    out = {}
    for key, value in figures.items():
        if not prefix and key in SKIPPED:
            continue
        if isinstance(value, dict):
            out.update(_leaves(value, (*prefix, key)))
        else:
            out[(*prefix, key)] = value
    return out


@dataclass(frozen=True)
class Gap:
    """One figure of the reference against this run's."""
    name: str
    reference: object
    run: object
    unit: str | None  # a SPREAD unit, or None: the figure must be equal

    @property
    def size(self) -> float:
        if isinstance(self.reference, (int, float)) and isinstance(self.run, (int, float)):
            return abs(self.run - self.reference)
        return 0.0 if self.reference == self.run else float("inf")

    @property
    def within(self) -> bool:
        if self.unit:
            return self.size <= SPREAD[self.unit] + 1e-12
        # counted from the data alone: equal but for the last bits of a float sum
        return self.size <= 1e-9 * max(1.0, abs(self.reference)) if isinstance(self.reference, (int, float)) \
            else self.size == 0

    def __str__(self) -> str:
        bound = f"bound {SPREAD[self.unit]:g} {self.unit}" if self.unit else "must be equal"
        return (f"{self.name}: README {_show(self.reference)}, this run {_show(self.run)} (gap {self.size:.3g}; "
                f"{bound})")


def _show(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def gaps(reference: dict, run: dict) -> list[Gap]:
    """Every figure of either side, largest gap first; one missing on a side compares as None (never within)."""
    ref, got = _leaves(reference), _leaves(run)
    found = [Gap("/".join(path), ref.get(path), got.get(path), _unit(path)) for path in ref.keys() | got.keys()]
    return sorted(found, key=lambda gap: (-gap.size / (SPREAD[gap.unit] if gap.unit else 1e-9), gap.name))


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
        f"What the demo measured ({f['steps']} steps; the same numbers on every run on one host: fixed seeds, CPU): "
        f"unigram entropy {f['entropy']:.3f} nats/token; CLM loss {f['train_loss']['clm']:.3f}, MLM loss "
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
    parser.add_argument("--reference", type=Path, default=Path("docs/demo_figures.json"),
                        help="the README's figures at full precision (written by `write`, read on another host)")
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
        args.reference.parent.mkdir(parents=True, exist_ok=True)
        args.reference.write_text(json.dumps(figures, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote the demo's figures into {args.readme} and {args.reference}")
        return 0
    if written == paragraph:
        print(f"{args.readme}: the demo figures match {args.figures} (README's from {readme_host}; this run on "
              f"{run_host})")
        return 0
    if run_host == readme_host:
        return _exact_failure(args, written, paragraph, readme_host)
    return _check_within_spread(args, figures, written, readme_host, run_host)


def _exact_failure(args, written: str, paragraph: str, host: str) -> int:
    diff = difflib.unified_diff(written.splitlines(), paragraph.splitlines(), str(args.readme), "from the demo run",
                                lineterm="")
    print(f"error: {args.readme}'s demo figures are not what {args.figures} measured on the same host ({host}), "
          f"where they must be equal; rerun `make demo` and `python -m mlmclm.demo_figures write`.\n"
          + "\n".join(diff), file=sys.stderr)
    return 1


def _check_within_spread(args, figures: dict, written: str, readme_host: str, run_host: str) -> int:
    where = (f"  README's figures were measured on: {readme_host}\n"
             f"  this run's host:                   {run_host}")
    if not args.reference.is_file():
        print(f"error: this run is on another host than the README's, and {args.reference} (the README's figures at "
              f"full precision, written by `python -m mlmclm.demo_figures write`) is missing\n{where}",
              file=sys.stderr)
        return 2
    reference = json.loads(args.reference.read_text())
    if render(reference) != written or reference.get("host", "not recorded") != readme_host:
        print(f"error: {args.readme}'s demo paragraph is not {args.reference}'s figures: write both from one run "
              f"(`make demo`, then `python -m mlmclm.demo_figures write`)\n{where}", file=sys.stderr)
        return 1
    compared = gaps(reference, figures)
    outside = [gap for gap in compared if not gap.within]
    if outside:
        print(f"error: on another host than the README's each demo figure may move by {_spread_text()}; "
              f"{len(outside)} of {len(compared)} moved further:\n{where}\n"
              + "\n".join(f"  {gap}" for gap in outside), file=sys.stderr)
        return 1
    print(f"{args.readme}: this run's {len(compared)} demo figures are within the spread allowed between hosts "
          f"({_spread_text()}) of the README's; exact equality is checked on the README's host only.\n{where}\n"
          "  largest gaps:\n" + "\n".join(f"    {gap}" for gap in compared[:3]))
    return 0


def _spread_text() -> str:
    return ", ".join(f"{bound:g} {unit}" for unit, bound in SPREAD.items())

if __name__ == "__main__":
    sys.exit(main())
