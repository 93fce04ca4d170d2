"""Ctrl-C on a real local launch, pressed as a terminal presses it: SIGINT to the launcher's whole process group.

NeMo-Run's local executor starts torchrun and each rank in sessions of their own, so only the launcher hears it. The
run must stop as a preemption does — saved at the next step boundary, the console saying so, exit 130, no traceback,
no process left — and the same command must resume it bit-identically to an uninterrupted run (the session's
`uninterrupted_tiny_run`, same recipe, data and steps). Run once more, the finished run starts no process."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from recipes.__main__ import main

ROOT = Path(__file__).resolve().parents[2]


def _metrics(run_dir: Path) -> list[dict]:
    """Every step's row without its timings (they differ between any two runs)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("perf/")} for row in rows]


def _launch(command: list[str], home: Path) -> subprocess.Popen:
    environment = {**os.environ, "HOME": str(home)}  # NeMo-Run's experiments go under ~/.nemo_run
    return subprocess.Popen(command, cwd=ROOT, env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # its own group, as a shell


def _wait_for_a_trained_step(run_dir: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text().strip():
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "the run trained no step"
        time.sleep(0.05)


def test_ctrl_c_saves_and_the_same_command_resumes_exactly(uninterrupted_tiny_run, tmp_path, nemo_home, capsys):
    reference = uninterrupted_tiny_run
    run_dir = tmp_path / "run"
    arguments = ["tiny_clm_mlm", f"steps={reference.steps}", f"run_dir={run_dir}", f"data_path={reference.data}",
                 "executor.gpus=false"]

    (tmp_path / "home").mkdir()
    launcher = _launch([sys.executable, "-m", "recipes", *arguments], tmp_path / "home")
    _wait_for_a_trained_step(run_dir, launcher)
    started = psutil.Process(launcher.pid).children(recursive=True)  # torchrun and its two ranks
    assert len(started) >= 3, started
    os.killpg(launcher.pid, signal.SIGINT)  # Ctrl-C: the terminal signals its foreground process group
    time.sleep(0.3)
    os.killpg(launcher.pid, signal.SIGINT)  # pressed again while the run saves
    console, _ = launcher.communicate(timeout=240)

    status = json.loads((run_dir / "run_status.json").read_text())
    assert status["status"] == "preempted" and status["step"] < reference.steps, (status, console)
    saved = status["step"]
    assert f"stopping: saved step {saved} in {run_dir} — run the same command to resume" in console, console
    assert "still finishing the save" in console, console
    assert "Traceback" not in console and "KeyboardInterrupt" not in console, console
    assert launcher.returncode == 130, console
    assert (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text().strip() == str(saved)
    _, alive = psutil.wait_procs(started, timeout=10)
    assert not alive, f"left running after Ctrl-C: {alive}"

    # the same command again (in this process: the launcher's start-up is paid once per session)
    capsys.readouterr()
    assert main(arguments) == 0
    console = capsys.readouterr().out
    assert f"resuming at step {saved} of {reference.steps}" in console, console
    assert _metrics(run_dir) == _metrics(reference.run_dir)  # every step's losses, LR and grad norm, bit for bit

    # finished: the same command returns at once; NeMo-Run (hence torchrun) is never started
    experiments = set(nemo_home.rglob("experiments/*/*"))
    assert main(arguments) == 0
    console = capsys.readouterr().out
    assert f"{run_dir}: the run already finished at step {reference.steps}; nothing to train" in console, console
    assert "Launching job" not in console and "Entering Experiment" not in console, console
    assert set(nemo_home.rglob("experiments/*/*")) == experiments and experiments
