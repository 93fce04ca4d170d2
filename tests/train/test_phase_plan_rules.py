"""Per-phase RoPE θ, context and data, the rules read without processes: each phase's model and data, the refusals
naming the field, a resume whose checkpoint was trained at another θ, a branch whose phases before it had another
θ or other data."""
import pytest

import train_scenarios as sc
from mlmclm.train.branch import BranchError, check_branch_plan
from mlmclm.train.config import TrainConfig
from mlmclm.train.resume_check import IncompatibleCheckpointError, check_rope_in_force


def _config(tmp_path, second_phase: dict, **overrides) -> TrainConfig:
    phases = [{"objective": {"kind": "clm"}, "steps": sc.SWITCH},
              {"objective": {"kind": "mlm", "mask_ratio": 0.3}, "steps": sc.TOTAL - sc.SWITCH, **second_phase}]
    return TrainConfig.from_dict(sc.config(tmp_path / "run", tmp_path / "data", phases=phases, **overrides))


def test_each_phase_carries_the_theta_and_context_until_a_later_phase_raises_them(tmp_path):
    cfg = _config(tmp_path, {"rope_theta": 160_000, "max_position_embeddings": 2048})
    models = cfg.phase_models()
    assert [(m.rope_theta, m.max_position_embeddings) for m in models] == [(10_000.0, 1024), (160_000.0, 2048)]
    assert cfg.model.rope_theta == 10_000.0                  # the run's model itself is untouched
    assert [m.hidden_size for m in models] == [cfg.model.hidden_size] * 2


@pytest.mark.parametrize("second, message", [
    ({"rope_theta": 5_000}, "phases[1].rope_theta 5000.0 is below the 10000.0 in force before it"),
    ({"max_position_embeddings": 512}, "phases[1].max_position_embeddings 512 is below the 1024 in force"),
    ({"rope_theta": 0}, "phase.rope_theta must be a number > 0"),
    ({"max_position_embeddings": 0}, "phase.max_position_embeddings must be an integer >= 1"),
])
def test_a_falling_or_invalid_theta_or_context_is_refused_naming_the_field(tmp_path, second, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        _config(tmp_path, second)


def test_a_checkpoint_trained_at_another_theta_is_refused_at_resume(tmp_path):
    cfg = _config(tmp_path, {"rope_theta": 40_000})
    at_step_6 = cfg.phase_models()[cfg.phase_at(5)]
    check_rope_in_force({"iteration": 6, "rope_theta": 40_000.0, "max_position_embeddings": 1024}, at_step_6, "ck")
    check_rope_in_force({"iteration": 6}, at_step_6, "ck")    # checkpoints from before per-phase θ record none
    with pytest.raises(IncompatibleCheckpointError,
                       match="rope_theta 10000.0 was in force at the checkpoint's step 6, but this config's phases "
                             "put 40000.0 there"):
        check_rope_in_force({"iteration": 6, "rope_theta": 10_000.0}, at_step_6, "ck")


def test_a_branch_whose_earlier_phases_had_another_theta_is_refused(tmp_path):
    parent = _config(tmp_path, {"rope_theta": 40_000}, schedule={"style": "wsd", "warmup_steps": 2, "decay_steps": 1})
    same = _config(tmp_path, {"rope_theta": 40_000}, schedule={"style": "wsd", "warmup_steps": 2, "decay_steps": 1})
    check_branch_plan(parent, same, 7, "parent")
    other = _config(tmp_path, {"rope_theta": 80_000}, schedule={"style": "wsd", "warmup_steps": 2, "decay_steps": 1})
    with pytest.raises(BranchError, match="phases.1.rope_theta: 40000.0 in force in the parent but 80000.0 here"):
        check_branch_plan(parent, other, 7, "parent")
    # before the θ switch the two plans agree: a branch at the switch may choose its own θ
    check_branch_plan(parent, other, sc.SWITCH, "parent")


def test_phases_naming_the_same_data_share_one_source(tmp_path):
    cfg = _config(tmp_path, {"data": {"path": str(tmp_path / "long")}})
    streams, of_phase = cfg.data_streams()
    assert [d.path for d in streams] == [str(tmp_path / "data"), str(tmp_path / "long")] and of_phase == [0, 1]
    again = TrainConfig.from_dict(sc.config(tmp_path / "run", tmp_path / "data", phases=[
        {"objective": {"kind": "clm"}, "steps": 3}, {"objective": {"kind": "mlm"}, "steps": 3,
                                                     "data": {"path": str(tmp_path / "long")}},
        {"objective": {"kind": "mlm"}, "steps": 4}]))
    assert again.data_streams()[1] == [0, 1, 0]


@pytest.mark.parametrize("data, message", [
    ({"path": "{data}", "seed": 7}, r"phases\[1\]\.data reads '.*data', which an earlier phase reads with other "
                                    r"settings"),
    ({"path": "{long}", "random_length": {"min_length": 12, "max_length": 64}},
     r"random-length samples \(data.random_length\) in some phases and prepared rows in others are not implemented"),
    ({"path": "{long}", "random_length": {"min_length": 12, "max_length": 4096}}, None),
])
def test_per_phase_data_that_would_read_wrong_is_refused_naming_the_phase(tmp_path, data, message):
    data = {k: (v.format(data=tmp_path / "data", long=tmp_path / "long") if isinstance(v, str) else v)
            for k, v in data.items()}
    if message is None:  # all phases random-length, but longer than the phase's context
        with pytest.raises(ValueError, match=r"phases\[1\]\.data\.random_length\.max_length 4096 exceeds the "
                                             r"max_position_embeddings 1024 of phase 1"):
            _config(tmp_path, {"data": data}, data={"path": str(tmp_path / "data"),
                                                    "random_length": {"min_length": 12, "max_length": 64}})
        return
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, {"data": data})


def test_a_branch_whose_earlier_phases_read_other_data_is_refused(tmp_path):
    wsd = {"style": "wsd", "warmup_steps": 2, "decay_steps": 1}
    parent = _config(tmp_path, {"data": {"path": str(tmp_path / "long")}}, schedule=wsd)
    moved = _config(tmp_path, {"data": {"path": str(tmp_path / "elsewhere")}}, schedule=wsd)
    check_branch_plan(parent, moved, 7, "parent")            # the same data, moved: a location is free
    other = _config(tmp_path, {"data": {"path": str(tmp_path / "long"), "seed": 9}}, schedule=wsd)
    with pytest.raises(BranchError, match="phases.1.data: the phase reads .* in the parent but .* here"):
        check_branch_plan(parent, other, 7, "parent")
    check_branch_plan(parent, other, sc.SWITCH, "parent")    # a branch at the switch may choose its data


def test_a_raised_context_longer_than_the_phases_samples_is_refused(tmp_path):
    from mlmclm.data.manifest import Manifest
    from mlmclm.train.data_fit import check_data_fits_model

    manifest = Manifest.__new__(Manifest)
    from mlmclm.data.tokenizer import load_tokenizer, tokenizer_identity

    manifest.tokenizer = tokenizer_identity(load_tokenizer("embedded"))  # the scenario's data.tokenizer
    manifest.seq_length, manifest.location = 1024, str(tmp_path / "long")
    cfg = _config(tmp_path, {"max_position_embeddings": 2048, "data": {"path": str(tmp_path / "long")}})
    with pytest.raises(ValueError, match=r"phases\[1\]\.max_position_embeddings 2048: the phase's longest sample is "
                                         r"1024 tokens \(the rows of .*long\), so the context it claims would never "
                                         r"be trained"):
        check_data_fits_model(cfg, manifest, 1, cfg.phase_models()[1])
    manifest.seq_length = 2048
    check_data_fits_model(cfg, manifest, 1, cfg.phase_models()[1])
