"""`python -m recipes eval`: the fine-tuning grid through NeMo-Run. On Slurm a job array of K tasks x G GPUs, each
task the same grid command over one output folder, under the training's requeue policy (dry runs here; the real
scheduler: tests/cluster/test_slurm_eval.py); locally one command whose refusal is printed once. Bad input is one
line, exit 2, nothing made."""
from pathlib import Path

import pytest

from recipes.__main__ import main

IMAGE = "/lustre/images/mlmclm.sqsh"
SLURM = ["--executor", "slurm", "executor.account=acct", f"executor.container_image={IMAGE}"]


def _srun(nemo_home) -> tuple[str, str]:
    (script,) = Path(nemo_home).rglob("eval_sbatch.sh")
    text = script.read_text()
    return text, next(line for line in text.splitlines() if line.startswith("srun "))


def test_slurm_dryrun_is_an_array_of_grid_commands_under_the_requeue_policy(nemo_home, tmp_path, capsys):
    rc = main(["eval", "--model", "610m-clm-42k=/checkpoints/hf/610m-clm-42k", "--model", "b=/checkpoints/hf/b",
               "--data-root", "/data/paper", "--task", "sst2", "--seeds", "0", "1", "--output",
               "/checkpoints/eval/paper", "--array-tasks", "4", "--gpus-per-task", "8", *SLURM,
               f"executor.job_dir={tmp_path / 'jobs'}", "executor.data_dir=/lustre/data",
               "executor.checkpoint_dir=/lustre/ckpt", "--dryrun"])
    assert rc == 0, capsys.readouterr()
    text, srun = _srun(nemo_home)
    for line in ("#SBATCH --array=0-3", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --gpus-per-node=8", "#SBATCH --cpus-per-task=64", "#SBATCH --signal=USR1@120",
                 "export TORCHX_MAX_RETRIES=1000000 MLMCLM_MAX_REQUEUES=3"):
        assert line in text.splitlines(), line
    assert "#SBATCH --exclusive" not in text  # tasks are sized by their GPUs, not whole nodes
    assert 'if [ "$exitcode" = 75 ]' in text and 'elif [ "$exitcode" = 2 ]' in text  # the training's policy
    command = ("python /opt/mlmclm/tools/evaluate.py grid --model 610m-clm-42k=/checkpoints/hf/610m-clm-42k "
               "--model b=/checkpoints/hf/b --data-root /data/paper --task sst2 --seeds 0 1 "
               "--output /checkpoints/eval/paper --workers 8 --device auto")  # a worker per GPU of the task
    assert srun.endswith(command), srun
    assert "torchrun" not in srun and "--container-image " + IMAGE in srun
    out = capsys.readouterr().out
    assert "a job array of 4 task(s) × 8 GPU(s), one output folder /checkpoints/eval/paper" in out


def test_a_local_refusal_is_the_commands_one_line_and_exit_2(nemo_home, tmp_path, capsys):
    not_a_model = tmp_path / "not_a_model"
    not_a_model.mkdir()
    output = tmp_path / "eval"
    rc = main(["eval", "--model", f"m={not_a_model}", "--smoke", "--output", str(output), "executor.gpus=false"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err == (f"error: task eval refused: --model m={not_a_model}: {not_a_model} is not a Hugging Face model "
                   f"folder (no config.json)\n")
    assert not output.exists()


@pytest.mark.parametrize("argv, message", [
    pytest.param(["--model", "a$(touch MARKER)=/x", "--smoke"], "--model label must be a plain name", id="label"),
    pytest.param(["--model", "a=/x y", "--smoke"], "--model a must be a path of", id="path-with-space"),
    pytest.param(["--model", "a", "--smoke"], "--model 'a': expected LABEL=HF_MODEL_DIR", id="no-dir"),
    pytest.param(["--smoke"], "no model: pass --model LABEL=HF_MODEL_DIR", id="no-model"),
    pytest.param(["--model", "a=/x", "--smoke", "--array-tasks", "0", *SLURM], "array_tasks and gpus_per_task must "
                 "be >= 1", id="array-0"),
    pytest.param(["--model", "a=/x", "--smoke", "--array-tasks", "2"], "--array-tasks is the Slurm job array's",
                 id="array-locally"),
    pytest.param(["--model", "a=/x", "--smoke", "--task", "sst2"], "--task selects tasks of the paper suite",
                 id="task-with-smoke"),
    pytest.param(["--model", "a=relative/hf", "--smoke", *SLURM], "--model a relative/hf is relative",
                 id="relative-on-slurm"),
    pytest.param(["--model", "a=/elsewhere/hf", "--smoke", *SLURM, "executor.checkpoint_dir=/lustre/ckpt"],
                 "--model a /elsewhere/hf is under no container mount", id="unmounted"),
    pytest.param(["--model", "a=/x", "--smoke", *SLURM, "executor.array=0-9"], "executor.array comes from the "
                 "evaluation", id="executor-array"),
    pytest.param(["--model", "a=/x", "--smoke", "--name", "a b"], "--name must be a plain name", id="title"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_made(argv, message, nemo_home, tmp_path, monkeypatch, capsys):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("MLMCLM_SLURM_JOB_DIR", str(cwd / "jobs"))
    assert main(["eval", *argv, "--output", "/checkpoints/eval/x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert list(cwd.iterdir()) == [] and not any(Path(nemo_home).rglob("*"))


HINT = "a key=value after a list flag is read as one of its values; put it before the flags, or end the list with --"


@pytest.mark.parametrize("argv, item", [
    pytest.param(["eval", "--model", "a=/x", "--output", "/o", "--smoke", "--seeds", "0", "1", "executor.gpus=false"],
                 "invalid seed 'executor.gpus=false'", id="eval-seeds"),
    pytest.param(["eval", "--model", "a=/x", "--output", "/o", "--smoke", "--lrs", "1e-4", "executor.gpus=false"],
                 "invalid learning rate 'executor.gpus=false'", id="eval-lrs"),
    pytest.param(["detour", "tiny", "--smoke", "--seeds", "0", "1", "steps=4"], "invalid seed 'steps=4'",
                 id="detour-seeds"),
])
def test_a_key_value_after_a_list_flag_is_refused_saying_where_it_goes(argv, item, nemo_home, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert f"{item}: {HINT}" in capsys.readouterr().err


def test_a_list_flag_ended_with_a_double_dash_leaves_the_key_values_as_overrides():
    from recipes import eval_run

    args = eval_run.parse_args(["--model", "a=/x", "--output", "/o", "--smoke", "--seeds", "0", "1", "--",
                                "executor.gpus=false"])
    assert args.seeds == [0, 1] and args.overrides == ["executor.gpus=false"]
    with pytest.raises(SystemExit):
        eval_run.parse_args(["--model", "a=/x", "--output", "/o", "--seeds", "zero"])  # a plain bad value: refused
