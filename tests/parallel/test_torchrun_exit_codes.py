"""What a Slurm job's batch script sees of its ranks: `python -m mlmclm.parallel.torchrun`'s exit code (a real agent
and real rank processes), and what cluster.executors.requeue_policy does with it (its shell text run by bash, the
`scontrol` it finally calls recorded). A refusal (exit 2 on every rank) is passed on as 2 and never requeued; a crash
is requeued as `max_requeues` allows; a preemption save always. The real scheduler runs the refusal case in
tests/cluster/test_slurm_failure.py and the preemption case in tests/cluster/test_slurm_training.py."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.executors import requeue_policy
from mlmclm.parallel.torchrun import stopped_with

# Rank 0 exits with its code at once; rank 1 exits with its own, or (None) waits to be ended by the agent's teardown.
RANK_SCRIPT = """
import os, sys, time
codes = {0: RANK0, 1: RANK1}
code = codes[int(os.environ["RANK"])]
if code is None:
    time.sleep(120)
else:
    if os.environ["RANK"] == "1":
        time.sleep(1)  # rank 0 exits first, as the first rank to refuse would
    sys.exit(code)
"""


def _agent_exit(tmp_path: Path, rank0: int, rank1: int | None) -> subprocess.CompletedProcess:
    script = tmp_path / f"rank_{rank0}_{rank1}.py"
    script.write_text(RANK_SCRIPT.replace("RANK0", repr(rank0)).replace("RANK1", repr(rank1)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "mlmclm.parallel.torchrun", "--nproc-per-node", "2",
                           "--standalone", "--monitor-interval", "0.2", str(script)],
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("rank0, rank1, expected", [
    (2, 2, 2),        # every rank refused its input
    (2, None, 2),     # one refused; the agent ended the other
    (75, None, 75),   # a preemption save, as before
    (1, None, 1),     # a crash
])
def test_the_agent_passes_a_refusal_on_as_2_and_anything_mixed_as_a_failure(tmp_path, rank0, rank1, expected):
    done = _agent_exit(tmp_path, rank0, rank1)
    assert done.returncode == expected, done.stderr[-3000:]
    if expected == 2:
        assert "the ranks refused their input" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_refusal_beside_a_crash_is_a_crash():
    """Ranks that exit in the same monitoring round: only when none crashed is it a refusal (the agent's teardown
    ends the others as soon as it sees the first exit, so the real agent rarely shows two codes)."""
    assert stopped_with(2, [2, -15, 2]) and not stopped_with(2, [2, 1]) and not stopped_with(2, [75, 2])


def _policy(tmp_path: Path, exitcode: int, restarts: int, max_requeues: int = 3) -> tuple[bool, str]:
    """Run requeue_policy's lines in bash, then the call NeMo-Run's script ends with; True when `scontrol requeue`
    reached the real command (here a stand-in on PATH that records its arguments)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "scontrol_calls"
    calls.unlink(missing_ok=True)
    stand_in = bin_dir / "scontrol"
    stand_in.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    stand_in.chmod(0o755)
    script = f"{requeue_policy(max_requeues)}\nexitcode={exitcode}\nscontrol requeue $SLURM_JOB_ID\n"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42",
           "SLURM_RESTART_COUNT": str(restarts)}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    requeued = calls.exists() and calls.read_text() == "requeue 42\n"
    return requeued, done.stdout + done.stderr


def test_the_requeue_policy_never_requeues_a_refusal_and_requeues_a_crash_as_allowed(tmp_path):
    requeued, said = _policy(tmp_path, exitcode=2, restarts=0)
    assert not requeued and "refused its input (exit 2): not requeued" in said, said
    requeued, said = _policy(tmp_path, exitcode=1, restarts=0)
    assert requeued and "failed (exit 1): requeued (restart 1 of 3)" in said, said
    requeued, said = _policy(tmp_path, exitcode=1, restarts=3)
    assert not requeued and "failed (exit 1) after 3 restart(s): not requeued" in said, said
    requeued, said = _policy(tmp_path, exitcode=75, restarts=10)
    assert requeued and "preempted after saving" in said, said


def test_the_images_torchrun_is_our_agent(tmp_path):
    """cluster/Dockerfile replaces the image's `torchrun` (NeMo-Run's srun line calls it by name) with our agent: its
    RUN line, run by sh against a PATH that holds a stand-in `torchrun` and this interpreter as `python`, leaves a
    `torchrun` that passes a refusal on as 2. (No image is built here: the line itself is what runs.)"""
    text = (Path(__file__).resolve().parents[2] / "cluster" / "Dockerfile").read_text()
    joined = text.replace("\\\n", " ")
    (line,) = [row for row in joined.splitlines() if row.startswith("RUN ") and "mlmclm.parallel.torchrun" in row]
    bin_dir = tmp_path / "image_bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text("#!/bin/sh\nexit 99\n")  # the image's own, replaced
    (bin_dir / "torchrun").chmod(0o755)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')  # the image's interpreter
    (bin_dir / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    subprocess.run(["sh", "-c", line.removeprefix("RUN ")], env=env, check=True, timeout=30)
    script = tmp_path / "refuse.py"
    script.write_text("import sys\nsys.exit(2)\n")
    done = subprocess.run([str(bin_dir / "torchrun"), "--nproc-per-node", "2", "--standalone", "--monitor-interval",
                           "0.2", str(script)], env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "the ranks refused their input" in done.stderr, done.stderr[-3000:]
