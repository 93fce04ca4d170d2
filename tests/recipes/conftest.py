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
    """Slurm executors refuse to build without an mlmclm image (cluster.executors.container_image_for_slurm); the
    dry runs here use a placeholder one. Tests of that refusal delete it."""
    monkeypatch.setenv("MLMCLM_CONTAINER_IMAGE", "/images/mlmclm-test.sqsh")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    from recipes.tiny import prepare_tiny_data

    # 40k tokens = ~300 packed sequences of 128: plenty for the few 8-sequence steps the tests train.
    return str(prepare_tiny_data(str(tmp_path_factory.mktemp("recipes") / "demo_data"), max_tokens=40_000))
