"""Training on the real scheduler through `python -m recipes ... --executor slurm` (slurm_scenarios.py): one config
uninterrupted on the local executor, and on two Slurm nodes preempted twice as Slurm delivers it — by its time
limit with the recipe's `--signal=USR1@N` lead, then by `scancel --signal=USR1` (every process of the step gets
USR1: the torchrun agents and the ranks) — and requeued. The two-node run is the preempted one
(a separate uninterrupted two-node job would cost the 2-core suite a minute); if only the first test fails, look at
the rendezvous, if both, at the resume (tests/train/test_preemption.py checks that on one node).
"""
import pytest

from slurm_helpers import REPO, no_job_process_left
from slurm_scenarios import STEPS, losses, run_status

# The first test to ask for `scenarios` runs every Slurm launch in its setup (slurm_scenarios.py): 5 min measured
# on this otherwise idle 2-core machine; under load it takes longer, and the suite-wide 600 s per test could cut it off.
pytestmark = pytest.mark.timeout(1800)


def test_two_slurm_nodes_train_like_the_local_executor(scenarios):
    """torchrun's rendezvous across two Slurm nodes (at each of the run's three starts); the same losses, bit for bit,
    as the local executor's run; the launch's console follows the job through its requeues to the end."""
    two_nodes, local = scenarios["preempted"], scenarios["local"]
    assert local.returncode == 0, local.stdout + local.stderr
    assert two_nodes.returncode == 0, two_nodes.stdout + two_nodes.stderr
    console = two_nodes.stdout + two_nodes.stderr
    job = scenarios["job_id"]
    for state in ("RUNNING on n[1-2]", "RUNNING on n[1-2], restarted 1×", "RUNNING on n[1-2], restarted 2×",
                  "COMPLETED, restarted 2×"):  # one task per node, each start
        assert f"job {job} (tiny_clm_mlm): {state}" in console, console
    ours, reference = losses(scenarios["dirs"]["preempted"]), losses(scenarios["dirs"]["local"])
    assert [row["step"] for row in ours] == list(range(1, STEPS + 1))
    assert ours == reference


def test_preempted_by_time_limit_and_scancel_usr1_saves_requeues_and_resumes_exactly(scenarios, slurm_cluster):
    job_id, run_dir, facts = scenarios["job_id"], scenarios["dirs"]["preempted"], scenarios["facts"]
    print(f"measured: {facts}")
    final = scenarios["final"]
    assert (final.state, final.restarts) == ("COMPLETED", 2), final.describe()
    # each preemption published a checkpoint at the step it stopped, and the next start resumed from it
    first, second = facts["first"], facts["second"]
    assert first["status"] == "preempted" and second["status"] == "preempted", facts
    assert first["step"] < second["step"] < STEPS
    assert first["detail"].endswith(f"iter_{first['step']:07d}") and second["detail"].endswith(
        f"iter_{second['step']:07d}")
    # every process of the step saved or ignored USR1: the ranks all exited 75 after the save (a rank or agent
    # killed by it would turn the exit into a failure), and the job requeued itself as preempted
    logs = {p.name: p.read_text(errors="replace")
            for p in sorted((REPO / scenarios["exp_dir"]).rglob(f"*_{job_id}*.out"))}
    starts = [logs[name] for name in sorted(n for n in logs if n.startswith("log-"))]
    assert len(starts) == 3
    for text in starts[:2]:
        assert "stop requested (SIGTERM/SIGUSR1): saved at step" in text
        assert "torchrun: ranks stopped after a preemption save (exit codes [75]); exiting 75" in text
    for text in starts:
        assert "SIGUSR1" not in text.replace("SIGTERM/SIGUSR1", "") and "exitcode: -10" not in text, text[-3000:]
    (batch,) = [text for name, text in logs.items() if name.startswith("sbatch_")]
    verdicts = [line for line in batch.splitlines() if line.startswith("mlmclm: ")]
    assert verdicts == ["mlmclm: preempted after saving (exit 75): requeued, the run resumes from its checkpoint"] * 2
    assert run_status(run_dir) == {"status": "completed", "step": STEPS,
                                   "detail": str(run_dir / "checkpoints" / f"iter_{STEPS:07d}")}
    # bit-identical to the uninterrupted run (one row per step: metrics.jsonl is rewound at each resume)
    assert losses(run_dir) == losses(scenarios["dirs"]["local"])
    no_job_process_left(slurm_cluster)


def test_the_daemons_listen_on_the_ports_chosen_below_the_kernels_ephemeral_range(slurm_cluster):
    """slurmctld and each slurmd bind the ports the config names after `up` let them go: a port the kernel hands
    out (bind to 0) could be taken by any outgoing connection in between (a test's rendezvous, pip), and a daemon
    would fail to start. The chosen ports are below the kernel's ephemeral range, and the daemons hold them."""
    import re

    import psutil

    from cluster.local_slurm import DAEMON_PORTS_FLOOR, ephemeral_floor

    text = slurm_cluster.conf.read_text()
    ports = [int(p) for p in re.findall(r"^SlurmctldPort=(\d+)$", text, flags=re.M)]
    ports += [int(p) for p in re.findall(r"^NodeName=\S+ .*\bPort=(\d+)\b", text, flags=re.M)]
    assert len(ports) == 1 + len(slurm_cluster.nodes) == len(set(ports)), text
    assert all(DAEMON_PORTS_FLOOR <= port < ephemeral_floor() for port in ports), (ports, ephemeral_floor())
    listening = {c.laddr.port for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
    assert set(ports) <= listening, (ports, sorted(listening))
