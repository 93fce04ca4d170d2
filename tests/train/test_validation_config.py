"""Random-length samples and validation: a bad config is refused when it is built, naming the field."""
import pytest

import train_scenarios as sc
from mlmclm.data.blend import build_loader
from mlmclm.data.manifest import Manifest
from mlmclm.train.config import TrainConfig
from mlmclm.train.validation import validation_path


def build(tmp_path, **overrides):
    return TrainConfig.from_dict(sc.config(tmp_path / "run", tmp_path / "data", **overrides))


@pytest.mark.parametrize("overrides, field", [
    ({"validation": {"interval": 0}}, "validation.interval"),
    ({"validation": {"samples": 0}}, "validation.samples"),
    ({"validation": {"samples": 5}}, "validation.samples"),   # not a multiple of micro_batch_size 2
    ({"validation": {"mask_ratio": 1.0}}, "validation.mask_ratio"),
    ({"validation": {"enabled": False, "path": "x"}}, "validation.path"),
    ({"data": {"path": "d", "random_length": {"min_length": 20, "max_length": 10}}}, "data.random_length"),
    ({"data": {"path": "d", "random_length": {"min_length": 12, "max_length": 4096}}},
     "data.random_length.max_length"),
    # names that become folders of the TensorBoard layout (mlmclm/tensorboard_tags.py): one plain component
    ({"phases": [{"objective": {"kind": "clm"}, "fraction": 1.0, "name": "../clm"}]}, "phase.name"),
    ({"phases": [{"objective": {"kind": "clm"}, "fraction": 1.0, "name": "mlm 40%"}]}, "phase.name"),
    ({"logging": {"run_name": "a/b"}}, "logging.run_name"),
])
def test_bad_settings_name_their_field(tmp_path, overrides, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        build(tmp_path, **overrides)


def test_tensorboard_run_name_defaults_to_the_run_directorys_name(tmp_path):
    named = TrainConfig.from_dict(sc.config(tmp_path / "my-run.2", tmp_path / "data"))
    assert named.tensorboard_run_name == "my-run.2"
    assert build(tmp_path, logging={"run_name": "clm-42k"}).tensorboard_run_name == "clm-42k"


def test_validation_follows_the_manifest_and_says_when_it_cannot(tmp_path):
    manifest = Manifest(seq_length=64, num_samples=1, num_tokens=64, tokenizer={}, shards=[])
    manifest.location = str(tmp_path / "data" / "manifest.json")
    assert validation_path(build(tmp_path), manifest) is None   # no split recorded: off, as before
    with pytest.raises(ValueError, match="validation.enabled"):
        validation_path(build(tmp_path, validation={"enabled": True}), manifest)
    manifest.validation = {"path": "validation/manifest.json", "every": 10}
    assert validation_path(build(tmp_path), manifest) == str(tmp_path / "data" / "validation" / "manifest.json")
    assert validation_path(build(tmp_path, validation={"enabled": False}), manifest) is None
    blend = build(tmp_path, data={"blend": {"a": 1.0, "b": 1.0}, "random_length": {"min_length": 4,
                                                                                  "max_length": 64}})
    with pytest.raises(ValueError, match="data.random_length"):
        build_loader(blend.data, 8, 2)
