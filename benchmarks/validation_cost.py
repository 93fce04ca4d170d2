"""What validation costs a run: its seconds per evaluation against the training steps' seconds, from a run's
metrics.jsonl, as a share of training time at a given `validation.interval`.

    python benchmarks/validation_cost.py artifacts/demo/run --interval 1000

Each row of metrics.jsonl has the step's tokens/s (validation time left out) and, on a validation step,
`perf/validation_s`. A step's seconds are its tokens over its tokens/s; the first steps (start-up, compilation)
are skipped.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def cost(run_dir: Path, interval: int, skip: int = 5) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r["step"] > skip]
    tokens = {r["step"]: r["train/tokens"] for r in rows}
    step_s = [(r["train/tokens"] - tokens[r["step"] - 1]) / r["perf/tokens_per_s"] for r in rows
              if r["step"] - 1 in tokens]
    validation_s = [r["perf/validation_s"] for r in rows if "perf/validation_s" in r]
    if not step_s or not validation_s:
        raise SystemExit(f"{run_dir}: no validation or too few steps in metrics.jsonl")
    step, evaluation = statistics.median(step_s), statistics.median(validation_s)
    return {"step_s": step, "validation_s": evaluation, "evaluations": len(validation_s),
            "share": evaluation / (interval * step + evaluation)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--interval", type=int, default=1000, help="validation.interval to cost (default 1000)")
    args = parser.parse_args(argv)
    c = cost(args.run_dir, args.interval)
    print(f"median step {c['step_s'] * 1e3:.1f} ms, median validation {c['validation_s'] * 1e3:.1f} ms "
          f"({c['evaluations']} evaluations): {c['validation_s'] / c['step_s']:.2f} steps' time each; "
          f"at interval {args.interval}: {c['share']:.2%} of training time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
