"""What a training rank's start costs: the same tiny local run (NeMo-Run's local executor, torchrun, P ranks,
two steps) launched as it is (`python -m recipes.rank` in each rank, recipes/rank_task.py) and as NeMo-Run would
launch the recipe's Partial itself (its `fdl_runner` in each rank), side by side in interleaved rounds.

    python benchmarks/rank_startup.py --rounds 3 --processes 2

Per launch: wall seconds and CPU seconds of the whole launch (the `python -m recipes` process and every process
under it: NeMo-Run's launcher, torchrun's agent, the ranks). Both variants train the same config from the same
data; only what each rank imports and how it reads its task differ.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("recipes.rank", "fdl_runner")


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def launch_once(variant: str, work: Path, data: Path, processes: int, index: int) -> tuple[float, float]:
    """(wall s, CPU s) of one launch in a fresh process; its run and NeMo-Run's files under `work`."""
    argv = ["tiny_clm", "steps=2", f"processes={processes}", f"run_dir={work / f'run-{index}'}",
            f"data_path={data}", "--executor", "local", "executor.gpus=false", "--name", f"bench{index}"]
    cpu, started = child_cpu(), time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--launch", variant, "--", *argv], cwd=ROOT,
                          env={**os.environ, "NEMORUN_HOME": str(work / "nemo_run")}, capture_output=True, text=True)
    wall, used = time.perf_counter() - started, child_cpu() - cpu
    if proc.returncode:
        raise SystemExit(f"{variant} launch failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return wall, used


def run_launch(variant: str, argv: list[str]) -> int:
    """In the child: the recipe CLI, its training task given to NeMo-Run as the script or as the Partial."""
    from recipes import launch
    from recipes.__main__ import main

    if variant == "fdl_runner":
        launch.as_launched = lambda task: task  # NeMo-Run packages the Partial: its fdl_runner in every rank
    return main(argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2, help="ranks per launch (default 2)")
    parser.add_argument("--launch", choices=VARIANTS, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.launch:
        return run_launch(args.launch, [a for a in rest if a != "--"])
    from recipes.tiny import prepare_tiny_data

    results = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="rank-startup-") as tmp:
        work = Path(tmp)
        data = prepare_tiny_data(str(work / "data"))
        for round_ in range(args.rounds):
            order = VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]  # neither always first
            for variant in order:
                wall, cpu = launch_once(variant, work, data, args.processes, sum(map(len, results.values())))
                results[variant].append((wall, cpu))
                print(f"round {round_ + 1}: {variant:12s} wall {wall:5.1f} s  CPU {cpu:5.1f} s", flush=True)
    for variant, rows in results.items():
        print(f"{variant:12s} median of {len(rows)}: wall {statistics.median(r[0] for r in rows):5.1f} s, "
              f"CPU {statistics.median(r[1] for r in rows):5.1f} s ({args.processes} ranks a launch)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
