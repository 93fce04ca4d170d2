#!/usr/bin/env python
"""The GPU session's sections one after the other without their timeouts — for an interactive GPU machine or the
NGC image (`make gpu-check`); on CPU their dry-run shapes (`make gpu-check-smoke`).

    python benchmarks/gpu_check.py --out artifacts/gpu_check                       # every section
    python benchmarks/gpu_check.py --out /tmp/gc --sections speed_bf16 memory      # some

Each section runs in its own process (`benchmarks/gpu_session.py run`), writes OUT/<section>.json as the session
does, and the summary is printed at the end. For a device lent for one bounded command use
`bash benchmarks/gpu_session.sh OUT` instead: the same sections, each under its timeout, within 540 s in all.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpu_session import SECTIONS, finish, start  # noqa: E402


def main(argv=None) -> int:
    names = [name for name, _, _ in SECTIONS]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sections", nargs="+", choices=names, default=names)
    args = parser.parse_args(argv)
    start(args.out)
    failed = []
    for name in [n for n in names if n in args.sections]:
        code = subprocess.call([sys.executable, str(HERE / "gpu_session.py"), "run", name, "--out", str(args.out),
                                "--budget-s", "1e9"], stdin=subprocess.DEVNULL)
        if code:
            failed.append(name)
    finish(args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
