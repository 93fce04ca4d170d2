"""A real two-node Slurm (cluster/local_slurm.py) for the tests here, up once per session, and launches through
`python -m recipes ... --executor slurm` exactly as a user types them (bare-metal: this venv on a "shared" folder).

Without Slurm installed these tests skip, saying how to get it; CI (`.ci/run`) installs it and sets
MLMCLM_REQUIRE_SLURM=1, which turns the skip into a failure.
"""
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from cluster.local_slurm import INSTALL_HINT, LocalSlurm, missing_binaries
from slurm_helpers import REPO


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    missing = missing_binaries()
    reason = None
    if missing:
        reason = f"no local Slurm ({', '.join(missing)} not found): {INSTALL_HINT}"
    elif os.geteuid() != 0:
        reason = "the local Slurm runs munged as the munge user and slurmd as root: run these tests as root"
    if reason:
        if os.environ.get("MLMCLM_REQUIRE_SLURM"):
            pytest.fail(f"MLMCLM_REQUIRE_SLURM is set but {reason}")
        pytest.skip(reason)
    # not under pytest's own folders: they are private to root, and munged runs as the munge user
    # 8 CPUs a node (slurmd's config_overrides): every scenario's jobs fit at once, none waits for resources
    cluster = LocalSlurm(Path(tempfile.mkdtemp(prefix="mlmclm-slurm-")), cpus=8)
    cluster.up()
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)  # scontrol/squeue from the tests themselves
    yield cluster
    if saved is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = saved
    killed = cluster.down()
    left = cluster.job_processes()
    shutil.rmtree(cluster.root, ignore_errors=True)
    assert not killed, f"left running at the end of the session, killed by PID: {killed}"
    assert not left


@pytest.fixture(scope="session")
def shared(tmp_path_factory, slurm_cluster) -> Path:
    """The "shared filesystem" of the test cluster: every node sees this folder (and the venv and checkout)."""
    return tmp_path_factory.mktemp("shared")


@pytest.fixture(scope="session")
def slurm_data(shared) -> str:
    from recipes.tiny import prepare_tiny_data

    return str(prepare_tiny_data(str(shared / "demo_data"), max_tokens=40_000))


@pytest.fixture(scope="session")
def launch_env(slurm_cluster, shared) -> dict[str, str]:
    """What a user on this cluster exports: no container image, the shared folders, an account."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLMCLM_")}
    env.update(slurm_cluster.env)
    # NeMo-Run's LocalTunnel wants its job_dir to be NEMORUN_HOME/experiments
    env.update({"NEMORUN_HOME": str(shared / "nemorun"), "MLMCLM_SLURM_ACCOUNT": "test",
                "MLMCLM_SLURM_JOB_DIR": str(shared / "nemorun" / "experiments"),
                "MLMCLM_SHARED_DIRS": f"{shared}:{sys.prefix}:{REPO}"})
    return env


@pytest.fixture(scope="session")
def scenarios(slurm_cluster, launch_env, shared, slurm_data) -> dict:
    """Every Slurm launch of the tests, run together to their end (slurm_scenarios.py)."""
    from slurm_scenarios import launch_all

    return launch_all(launch_env, shared, slurm_data)
