import contextlib
import io
import sys
from types import SimpleNamespace

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


UNINTERRUPTED_STEPS = 12  # long enough for a test to press Ctrl-C mid-run (tests/recipes/test_recipes_ctrl_c.py)


@pytest.fixture(scope="session")
def uninterrupted_tiny_run(tmp_path_factory, tiny_data):
    """`tiny_clm_mlm` for 12 steps through NeMo-Run's LocalExecutor, launched once per session in this process (2
    torchrun CPU ranks): the local launch's own test reads its console and outputs, and the Ctrl-C test compares
    its stopped-and-resumed run with this one."""
    from recipes import launch
    from recipes.progress import RunProgress

    root = tmp_path_factory.mktemp("uninterrupted")
    run_dir = root / "run"
    partial, _ = launch.build("tiny_clm_mlm", [f"steps={UNINTERRUPTED_STEPS}", f"run_dir={run_dir}",
                                               f"data_path={tiny_data}"])
    init = RunProgress.__init__
    console, previous_home = io.StringIO(), run.config.get_nemorun_home()
    run.config.set_nemorun_home(str(root / "nemo_run"))
    try:
        with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(console):
            patch.setattr(sys, "stdin", io.StringIO(""))  # see nemo_home
            patch.setattr(RunProgress, "__init__", lambda self, *a, **k: init(self, *a, **{**k, "interval": 1.0}))
            launch.launch([("tiny_clm_mlm", partial)], "local", {"gpus": False})
    finally:
        run.config.set_nemorun_home(previous_home)
    return SimpleNamespace(run_dir=run_dir, console=console.getvalue(), nemo_home=root / "nemo_run",
                           steps=UNINTERRUPTED_STEPS, data=tiny_data)
