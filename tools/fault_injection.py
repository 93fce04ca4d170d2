"""Kill -9 the tiny recipe at random moments, resume it, and count the runs that end bit-identical to an
uninterrupted one. Not a test: a measurement of how training survives faults.

    python tools/fault_injection.py --trials 10 --seed 0 --out artifacts/faults

Each trial launches the `tiny_clm_mlm` recipe's training config on 2 CPU ranks (`python -m mlmclm.parallel.torchrun`)
and, after a random delay, SIGKILLs one random victim: a rank, the torchrun agent, a helper process of a rank (the
checkpoint writer's manager, or multiprocessing's resource tracker), or the whole process tree (a node lost). Then it relaunches until the run completes (killing again in the first
relaunch with probability 1/2, so resumes are also interrupted) and compares the loss and learning rate of every
step with the uninterrupted reference. A trial passes when they are all identical.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mlmclm import quiet  # noqa: E402

quiet.install()


def _config_file(out: Path, run_dir: Path, data: Path, steps: int) -> Path:
    from recipes.base import validate
    from recipes.launch import build

    partial, _ = build("tiny_clm_mlm", [f"steps={steps}", f"run_dir={run_dir}", f"data_path={data}"])
    cfg = validate(partial).to_dict()
    cfg["checkpoint"]["save_interval"] = 3  # many saves: more moments to die inside one
    path = out / f"{run_dir.name}.json"
    path.write_text(json.dumps(cfg))
    return path


def _launch(config: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false",
           "PET_SHUTDOWN_TIMEOUT": "5"}  # a rank stuck beside a killed one is not waited for long
    return subprocess.Popen([sys.executable, "-m", "mlmclm.parallel.torchrun", "--standalone", "--nproc-per-node",
                             "2", "-m", "mlmclm.train", str(config)], stdout=log.open("a"),
                            stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True)


def _kill(agent: subprocess.Popen, rng: random.Random) -> str:
    import psutil

    try:
        tree = psutil.Process(agent.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return "nothing (already finished)"
    ranks = [p for p in tree if "mlmclm.train" in " ".join(p.cmdline())]
    helpers = [p for p in tree if p not in ranks]
    kind = rng.choice(["rank", "agent", "helper", "node"] if helpers else ["rank", "agent", "node"])
    if kind == "rank" and ranks:
        rng.choice(ranks).kill()
    elif kind == "helper":
        rng.choice(helpers).kill()
    elif kind == "agent":
        agent.kill()
    else:
        for proc in [psutil.Process(agent.pid)] + tree:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
    return kind


def _reap(agent: subprocess.Popen, config: Path) -> None:
    """What Slurm does at the end of a step: nothing the launch started survives it. A rank orphaned by a killed
    agent is found by its command line."""
    import psutil

    agent.wait()
    for proc in psutil.process_iter(["cmdline"]):
        if str(config) in " ".join(proc.info["cmdline"] or []):
            try:
                proc.kill()
                proc.wait(10)
            except psutil.NoSuchProcess:
                pass


def _losses(run_dir: Path) -> dict:
    rows = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows[row["step"]] = (row[f"train/{row['phase']}/loss"], row["train/lr"])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="artifacts/faults")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    from recipes.tiny import prepare_tiny_data

    data = prepare_tiny_data(str(out / "data"))
    reference = out / "reference"
    start = time.time()
    agent = _launch(_config_file(out, reference, data, args.steps), out / "reference.log")
    if agent.wait() != 0:
        print(f"the reference run failed: see {out / 'reference.log'}", file=sys.stderr)
        return 1
    duration = time.time() - start
    expected = _losses(reference)
    identical = 0
    for trial in range(args.trials):
        run_dir = out / f"trial{trial:02d}"
        config = _config_file(out, run_dir, data, args.steps)
        log = out / f"{run_dir.name}.log"
        kills = []
        for attempt in range(10):
            agent = _launch(config, log)
            if attempt < 2 and (attempt == 0 or rng.random() < 0.5):
                try:
                    agent.wait(timeout=rng.uniform(0.2, 1.0) * duration)
                except subprocess.TimeoutExpired:
                    kills.append(_kill(agent, rng))
            _reap(agent, config)
            status = run_dir / "run_status.json"
            if status.exists() and json.loads(status.read_text())["status"] == "completed":
                break
        same = (run_dir / "metrics.jsonl").exists() and _losses(run_dir) == expected
        identical += same
        print(f"trial {trial}: killed {', '.join(kills) or 'nothing'}; {attempt + 1} launch(es); "
              f"{'identical' if same else 'DIFFERENT'}", flush=True)
    print(f"{identical}/{args.trials} trials resumed bit-identically to the uninterrupted run")
    return 0 if identical == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
