"""A name that reaches NeMo-Run (an experiment's title, a task's name) is a plain name, refused otherwise before any
folder is made: NeMo-Run runs `mkdir -p {path}` through a shell and writes the title unquoted into the sbatch
script, so `--name 'n$(touch X)'` created X on the submitting machine and a name with a space made stray folders
(issue 56). Each entry point is tried from an empty working directory with both payloads in one name."""
from pathlib import Path

import pytest

from recipes import data_prep, launch, sweep, sweep_jobs
from recipes.__main__ import main

HOSTILE = "n$(touch MARKER) stray"
SLURM = ["--executor", "slurm", "executor.account=acct"]


def _nothing_made(cwd, nemo_home):
    assert not (cwd / "MARKER").exists(), "the name ran in a shell"
    assert list(cwd.iterdir()) == [], f"folders were made: {sorted(p.name for p in cwd.iterdir())}"
    assert not nemo_home.exists() or not any(nemo_home.rglob("*")), "NeMo-Run made the experiment's folders"


@pytest.mark.parametrize("argv", [
    pytest.param(["tiny_clm_mlm", "run_dir=/checkpoints/r", "data_path=/data/d", *SLURM, "--dryrun"], id="recipe"),
    pytest.param(["tiny_clm_mlm", "--dryrun"], id="recipe-local"),
    pytest.param(["grid", "paper", "--only", "210m-clm-42k", *SLURM, "--dryrun"], id="grid"),
    pytest.param(["eval", "--model", "a=/checkpoints/hf", "--smoke", "--output", "/checkpoints/eval", *SLURM,
                  "--dryrun"], id="eval"),
    pytest.param(["grid", "tiny", "--with-eval", *SLURM, "--dryrun"], id="grid-with-eval"),
])
def test_a_name_with_a_command_or_a_space_is_refused_before_anything_is_made(argv, tmp_path, nemo_home,
                                                                             monkeypatch, capsys):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("MLMCLM_SLURM_JOB_DIR", str(cwd / "jobs"))  # NeMo-Run's Slurm folders, if it got that far
    assert main([*argv, "--name", HOSTILE]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --name must be a plain name (letters, digits"), err
    assert repr(HOSTILE) in err
    _nothing_made(cwd, nemo_home)


def test_the_launchers_refuse_such_a_title_or_task_name_too(tmp_path, nemo_home, monkeypatch):
    """The library calls behind the CLIs (the sweep's `--name` also reaches `sweep.main` directly)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    partial, _ = launch.build("tiny_clm_mlm", ["run_dir=/checkpoints/r", "data_path=/data/d"])
    options = {"account": "acct", "job_dir": str(cwd / "jobs")}
    with pytest.raises(ValueError, match=r"^experiment title must be a plain name"):
        launch.launch([("tiny_clm_mlm", partial)], "slurm", options, title=HOSTILE, dryrun=True)
    with pytest.raises(ValueError, match=r"^task name must be a plain name"):
        launch.launch([(HOSTILE, partial)], "slurm", options, title="fine", dryrun=True)
    planned = sweep.select(sweep.build_plan("paper"), ["210m-clm-42k"])
    with pytest.raises(ValueError, match=r"^experiment title must be a plain name"):
        sweep_jobs.launch_plan(sweep.to_launch(planned), "slurm", options, title=HOSTILE, dryrun=True)
    with pytest.raises(ValueError, match=r"^experiment title must be a plain name"):
        data_prep.launch(data_prep.data_prep(output=str(cwd / "data"), seq_length=128), "local", title=HOSTILE,
                         dryrun=True)
    assert sweep.main(["paper", "--only", "210m-clm-42k", "--name", "a b", "--plan"]) == 2
    _nothing_made(cwd, nemo_home)


def _bare_metal_env(root):
    """A Python environment the bare-metal checks accept (a bin/python under a shared directory)."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").touch()
    return str(root)


@pytest.mark.parametrize("setting", ["job_dir", "container_image", "data_dir", "checkpoint_dir", "mounts",
                                     "python_env", "shared_dirs"])
def test_a_slurm_setting_the_script_holds_unquoted_is_one_inert_word(setting, tmp_path, monkeypatch):
    """The executor's folders, image and mounts are words of NeMo-Run's `mkdir -p` and of the sbatch script's
    `srun`, `export PATH` and `mkdir` lines, unquoted."""
    from cluster.executors import slurm_executor

    hostile = str(tmp_path / HOSTILE)
    options = {"account": "acct", "job_dir": str(tmp_path / "jobs"), "container_image": "/images/mlmclm.sqsh"}
    if setting in ("python_env", "shared_dirs"):  # bare metal: this checkout and an environment on shared folders
        import mlmclm

        monkeypatch.delenv("MLMCLM_CONTAINER_IMAGE")
        monkeypatch.delenv("MLMCLM_DATA_DIR")
        monkeypatch.delenv("MLMCLM_CHECKPOINT_DIR")
        env = _bare_metal_env(tmp_path / (HOSTILE if setting == "python_env" else "env"))
        checkout = str(Path(mlmclm.__file__).parents[1])
        options.update(container_image=None, python_env=env,
                       shared_dirs=[str(tmp_path), checkout] + ([hostile] if setting == "shared_dirs" else []))
    else:
        options[setting] = [f"{hostile}:/extra"] if setting == "mounts" else hostile
    with pytest.raises(ValueError, match=rf"^{setting} must be a path of letters, digits .* got '.*touch MARKER"):
        slurm_executor(nodes=1, **options)
    assert not (tmp_path / "MARKER").exists()


def test_a_job_dir_with_a_command_is_refused_by_the_launcher_in_one_line(tmp_path, nemo_home, monkeypatch, capsys):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    argv = ["tiny_clm_mlm", "run_dir=/checkpoints/r", "data_path=/data/d", *SLURM, "--dryrun"]
    assert main([*argv, f"executor.job_dir={cwd}/{HOSTILE}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: job_dir must be a path of letters"), err
    _nothing_made(cwd, nemo_home)
