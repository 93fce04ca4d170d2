"""Preemption as clusters deliver it: a signal to the torchrun *agent*, which forwards it to each rank's process
group. Real torchrun, real signals, 2 CPU ranks.

One run is interrupted twice and finished, then compared with an uninterrupted one. A rank starts no process of its
own, saves included (megatron's checkpoint writer once started a helper there, which the forwarded signal killed
with the save in it: `checkpoint.save_sharded`).
1. plain `torchrun` (what NeMo-Run starts) with the Slurm executor's settings, SIGUSR1 to the agent: the ranks save
   and stop, the checkpoint is published, `run_status.json` says preempted;
2. `python -m mlmclm.parallel.torchrun`, SIGTERM to the agent: the same, and the exit code is 75;
3. the wrapper again, to the end: exit 0, and every step's loss equals the uninterrupted run's, bit for bit.
After each launch no process it started is left.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

import train_scenarios as sc
from mlmclm.train import checkpoint as ckpt
from test_training_run import metrics, phase_loss

TOTAL, SWITCH = 24, 6


def _config_file(tmp_path: Path, run_dir: Path, data: Path) -> Path:
    cfg = sc.config(run_dir, data, tp=1, total_steps=TOTAL,
                    phases=[{"objective": {"kind": "clm"}, "steps": SWITCH},
                            {"objective": {"kind": "mlm", "mask_ratio": 0.3}, "steps": TOTAL - SWITCH}],
                    checkpoint={"save_interval": 2}, logging={"log_interval": 1})  # a save precedes each signal
    path = tmp_path / f"{run_dir.name}.json"
    path.write_text(json.dumps(cfg))
    return path


def _launch(config: Path, wrapper: bool, log: Path) -> subprocess.Popen:
    agent = [sys.executable, "-m", "mlmclm.parallel.torchrun"] if wrapper else \
        [str(Path(sys.executable).parent / "torchrun")]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false",
           # what the Slurm executor sets (cluster/executors.py): forward SIGUSR1 too, and wait for the save
           "PET_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1", "PET_SHUTDOWN_TIMEOUT": "120"}
    return subprocess.Popen(agent + ["--standalone", "--nproc-per-node", "2", "-m", "mlmclm.train", str(config)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=Path(__file__).parents[2])


def _logged_steps(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _interrupt(agent: subprocess.Popen, run_dir: Path, after_step: int, sig: int, log: Path) -> tuple[int, list]:
    """Send `sig` to the agent once `after_step` is logged; return its exit code and every process it started."""
    deadline = time.time() + 240
    while _logged_steps(run_dir) < after_step:
        assert agent.poll() is None, f"the run ended before step {after_step}:\n{log.read_text()[-3000:]}"
        assert time.time() < deadline, "no progress"
        time.sleep(0.05)
    started = psutil.Process(agent.pid).children(recursive=True)
    ranks = [p for p in started if p.ppid() == agent.pid]
    assert len(ranks) == 2, started
    # checked after a save (one every 2 steps): no helper process of a rank, which the signal would reach too
    helpers = [p for p in started if p not in ranks]
    assert not helpers, [p.cmdline()[:4] for p in helpers]
    agent.send_signal(sig)
    return agent.wait(timeout=240), started


def _assert_all_gone(processes: list) -> None:
    time.sleep(1.0)  # an exiting process needs a moment
    alive = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running: {[(p.pid, p.cmdline()[:4]) for p in alive]}"


def test_signals_to_the_torchrun_agent_save_report_and_resume_exactly(data, tmp_path):
    reference = tmp_path / "reference"
    done = _launch(_config_file(tmp_path, reference, data), True, tmp_path / "reference.log")
    assert done.wait(timeout=600) == 0, (tmp_path / "reference.log").read_text()[-3000:]

    run_dir = tmp_path / "run"
    config = _config_file(tmp_path, run_dir, data)
    root = run_dir / "checkpoints"

    # 1. plain torchrun, SIGUSR1 (Slurm's --signal=USR1@120) to the agent
    log = tmp_path / "first.log"
    _, started = _interrupt(_launch(config, False, log), run_dir, 3, signal.SIGUSR1, log)
    status = json.loads((run_dir / "run_status.json").read_text())
    assert status["status"] == "preempted", log.read_text()[-3000:]
    assert ckpt.latest_checkpoint(root) == root / f"iter_{status['step']:07d}"
    assert not list(root.glob(".staging_*"))
    _assert_all_gone(started)

    # 2. our wrapper, SIGTERM to the agent: same, and the caller sees 75
    log = tmp_path / "second.log"
    code, started = _interrupt(_launch(config, True, log), run_dir, status["step"] + 2, signal.SIGTERM, log)
    assert code == 75, log.read_text()[-3000:]
    second = json.loads((run_dir / "run_status.json").read_text())
    assert second["status"] == "preempted" and second["step"] > status["step"]
    assert ckpt.latest_checkpoint(root) == root / f"iter_{second['step']:07d}"
    _assert_all_gone(started)

    # 3. to the end, then compare with the uninterrupted run
    log = tmp_path / "third.log"
    assert _launch(config, True, log).wait(timeout=600) == 0, log.read_text()[-3000:]
    assert json.loads((run_dir / "run_status.json").read_text())["status"] == "completed"
    ours, ref = metrics(run_dir), metrics(reference)
    assert sorted(ours) == list(range(1, TOTAL + 1))
    for step in ref:
        assert phase_loss(ours[step]) == phase_loss(ref[step]), step
