"""Command-line overrides (recipe parameters, config paths, executor options) reach the final config."""
import pytest

from recipes import launch
from recipes.base import validate


def test_recipe_parameters_and_config_paths_reach_the_config():
    partial, overrides = launch.build("clm_mlm_610m", [
        "total_steps=12000", "clm_share=0.5", "mask_ratio=0.3", "nodes=4",
        "optimizer.lr=3e-4", "config.checkpoint.save_interval=250", "phases.0.name=causal",
        "executor.partition=batch"])
    cfg = validate(partial)
    assert cfg.total_steps == 12_000 and cfg.phase_steps() == [6_000, 6_000]
    assert cfg.phases[1].objective.mask_ratio == 0.3 and cfg.phases[0].name == "causal"
    assert partial.nodes == 4 and cfg.micro_batch_size * cfg.num_microbatches(32) * 32 == 2304
    assert cfg.optimizer.lr == 3e-4 and cfg.checkpoint.save_interval == 250
    assert overrides.executor == {"partition": "batch"}
    assert cfg.run_dir.endswith("/610m-clm-6k-mlm30-12k")  # the released models' naming


def test_the_executor_is_sized_by_the_recipe():
    partial, _ = launch.build("mlm_210m", ["nodes=3"])
    executor = launch.make_executor("slurm", partial, {"account": "acct", "job_dir": "/tmp/unused"})
    assert (executor.nodes, executor.nproc_per_node()) == (3, 8)
    with pytest.raises(ValueError, match="comes from the recipe"):
        launch.make_executor("slurm", partial, {"account": "acct", "nodes": 2})
    with pytest.raises(ValueError, match="local executor runs one node"):
        launch.make_executor("local", partial)
    tiny, _ = launch.build("tiny_clm_mlm", ["processes=4"])
    assert launch.make_executor("local", tiny, {"gpus": False}).nproc_per_node() == 4


@pytest.mark.parametrize("item, message", [
    ("optimizer.learning_rate=1", "has no field 'learning_rate'"),
    ("phases.7.steps=3", "not an index of a list of 2"),
    ("modle.hidden_size=3", "no config section named 'modle'"),
    ("total_steps", "not of the form key=value"),
    ("schedule.decay_steps=35000", "before the WSD decay"),  # 35k > the 31.5k MLM phase: checked after overrides
    # a recipe parameter of the wrong type names itself, not the arithmetic it would break in the builder
    ("total_steps=abc", "parameter total_steps='abc' is a str; it takes int"),
    ("total_steps=true", "parameter total_steps=True is a bool; it takes int"),
    ("clm_share=half", "parameter clm_share='half' is a str; it takes float"),
])
def test_bad_overrides_are_rejected_clearly(item, message):
    with pytest.raises(ValueError, match=message):
        launch.build("clm_mlm_610m", [item])


def test_a_value_the_config_refuses_is_one_line_on_the_command_line(capsys):
    """The config's own check, not fiddle's account of the whole call it failed in (~2 KB, every argument)."""
    from recipes.__main__ import main

    assert main(["tiny_clm", "steps=1", "run_dir=/tmp/unused", "--dryrun"]) == 2
    err = capsys.readouterr().err
    assert err == "error: schedule.warmup_steps 1 must be < total steps 1\n", err


def test_recipe_parameters_of_the_right_type_pass():
    cfg = validate(launch.build("tiny_clm_mlm", ["steps=12", "lr=1", "run_dir=/tmp/unused"])[0])
    assert cfg.total_steps == 12 and cfg.optimizer.lr == 1   # an int is a fine value for a float parameter


def test_slurm_needs_an_account(monkeypatch):
    monkeypatch.delenv("MLMCLM_SLURM_ACCOUNT", raising=False)
    partial, _ = launch.build("mlm_210m")
    with pytest.raises(ValueError, match="MLMCLM_SLURM_ACCOUNT"):
        launch.make_executor("slurm", partial)
    monkeypatch.setenv("MLMCLM_SLURM_ACCOUNT", "from-env")
    monkeypatch.setenv("MLMCLM_SLURM_JOB_DIR", "/tmp/unused")
    assert launch.make_executor("slurm", partial).account == "from-env"


def test_entry_refuses_a_world_size_the_recipe_was_not_sized_for(monkeypatch):
    partial, _ = launch.build("tiny_clm_mlm")
    monkeypatch.setenv("WORLD_SIZE", "3")
    import fiddle as fdl

    with pytest.raises(RuntimeError, match="sized for 1 node"):
        fdl.build(partial)()
