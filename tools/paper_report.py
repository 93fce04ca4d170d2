"""The paper's table and figures from evaluation folders (docs/evaluation.md, "Paper report").

  python tools/paper_report.py eval/610m-mlm40-42k eval/610m-clm-42k eval/biphasic --out artifacts/paper_report

Each RESULTS_DIR is a `tools/evaluate.py` output folder (runs/<model>/<task>/lr<lr>_seed<seed>.json, optionally
curve.json); model labels are the paper's run names (recipes/grid.py), e.g. 610m-clm-10k-mlm40-42k, and
`<run>-<step>` for intermediate checkpoints. Writes main_table.md/.csv, biphasic.png, data_efficiency.png,
stability.png (each figure when there is data) and report.md. The distance column compares with the paper's
numbers recorded in mlmclm/eval/reports/paper_reference.py and, with --reference-encodeval, with the authors' released
runs. Bad input: exit 2, nothing written. An --out that already holds a report is refused unless --force.
"""
from __future__ import annotations

from mlmclm import quiet

quiet.install()  # the figures read recipes/grid.py, which imports megatron: no TE/apex warning walls

import argparse
import sys
from pathlib import Path

from mlmclm.eval.reports.paper_reference import PAPER_SCORES
from mlmclm.eval.reports.paper_report import ReportInputError, released_reference, write_report
from recipes.grid import paper_catalogue


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, metavar="RESULTS_DIR")
    parser.add_argument("--out", type=Path, required=True, help="folder for the table, figures and report.md")
    parser.add_argument("--force", action="store_true", help="overwrite a report already in --out")
    parser.add_argument("--reference-encodeval", type=Path, metavar="RESULTS",
                        help="the authors' released per-run results (EncodEval MLM_vs_CLM results/ folder): "
                             "distance from their runs where the paper's printed numbers are not recorded")
    args = parser.parse_args(argv)
    try:
        reference = PAPER_SCORES if args.reference_encodeval is None else released_reference(args.reference_encodeval)
        report = write_report(args.results, args.out, force=args.force, reference=reference,
                              grid=paper_catalogue())
    except ReportInputError as err:
        print(f"paper_report: error: {err}", file=sys.stderr)
        return 2
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
