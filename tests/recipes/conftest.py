import io

import pytest

import nemo_run as run


@pytest.fixture
def nemo_home(tmp_path, monkeypatch):
    """NeMo-Run's experiment directory inside the test's tmp dir (restored afterwards).

    NeMo-Run's local tunnel runs shell commands through `invoke`, which mirrors stdin; pytest's captured stdin
    raises on read, so tests give it an empty one.
    """
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    previous = run.config.get_nemorun_home()
    run.config.set_nemorun_home(str(tmp_path / "nemo_run"))
    yield tmp_path / "nemo_run"
    run.config.set_nemorun_home(previous)


@pytest.fixture(autouse=True)
def slurm_container_image(monkeypatch):
    """The dry runs here are container-mode launches with a placeholder image, and placeholder host directories
    mounted at /data and /checkpoints (the paper recipes' paths: a launch whose paths are under no mount is refused,
    cluster.executors.check_reachable). Tests of those refusals delete them."""
    monkeypatch.setenv("MLMCLM_CONTAINER_IMAGE", "/images/mlmclm-test.sqsh")
    monkeypatch.setenv("MLMCLM_DATA_DIR", "/lustre/test-data")
    monkeypatch.setenv("MLMCLM_CHECKPOINT_DIR", "/lustre/test-checkpoints")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    from recipes.tiny import prepare_tiny_data

    # 40k tokens = ~300 packed sequences of 128: plenty for the few 8-sequence steps the tests train.
    return str(prepare_tiny_data(str(tmp_path_factory.mktemp("recipes") / "demo_data"), max_tokens=40_000))
