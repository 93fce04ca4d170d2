"""Compare training runs: TensorBoard losses per objective, downstream curves, stability -> PNGs + Markdown table.

Example:
  python tools/compare_runs.py --run CLM=runs/clm/tensorboard:eval/clm --run MLM-40=runs/mlm/tensorboard:eval/mlm \
      --output artifacts/compare
Each --run is LABEL=LOG_DIR[:EVAL_DIR]; LOG_DIR may be empty (LABEL=:EVAL_DIR) when only eval results exist.
"""
from __future__ import annotations

from mlmclm import quiet

quiet.install()  # before anything imports megatron/torch: no TE/apex/CUDA-absent warning walls

import argparse
import sys
from pathlib import Path

from mlmclm.eval.reports.compare import RunInputs, compare_runs


def parse_run(text: str) -> RunInputs:
    label, sep, paths = text.partition("=")
    if not sep or not label:
        raise ValueError(f"--run {text!r}: expected LABEL=LOG_DIR[:EVAL_DIR]")
    log_dir, _, eval_dir = paths.partition(":")
    return RunInputs(label=label, log_dir=Path(log_dir) if log_dir else None,
                     eval_dir=Path(eval_dir) if eval_dir else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", action="append", required=True, metavar="LABEL=LOG_DIR[:EVAL_DIR]")
    parser.add_argument("--output", type=Path, required=True, help="folder for the PNGs and comparison.md")
    args = parser.parse_args(argv)
    try:
        table = compare_runs([parse_run(r) for r in args.run], args.output)
    except (ValueError, FileNotFoundError) as err:
        print(f"compare_runs: error: {err}", file=sys.stderr)
        return 2
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
