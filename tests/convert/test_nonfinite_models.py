"""A model that computes NaN is neither imported nor exported: NaN rope_theta / rms_norm_eps in a source's
config.json are refused by convert_from_hf, and convert_to_hf refuses a checkpoint whose weights hold NaN, naming
the tensor; nothing is written either way. Before, both went through (an lr=Infinity run's NaN checkpoint was
exported as a model)."""
import json

import pytest
import torch
from convert_fixtures import assert_untouched, make_random_eurobert, make_tokenizer

from mlmclm.convert.dist_reader import CheckpointReadError
from mlmclm.convert.from_hf import ImportConfig, convert_from_hf
from mlmclm.convert.hf_config import UnsupportedModelError
from mlmclm.convert.to_hf import ExportConfig, convert_to_hf


def _set(config_path, edit) -> None:
    config = json.loads(config_path.read_text())
    edit(config)
    config_path.write_text(json.dumps(config))   # json writes NaN as NaN, which json and transformers read back


@pytest.mark.parametrize("field, edit", [
    ("rope_theta", lambda c: c["rope_parameters"].update(rope_theta=float("nan"))),
    ("norm_eps", lambda c: c.update(rms_norm_eps=float("nan"))),
    ("norm_eps", lambda c: c.update(rms_norm_eps=float("inf"))),
    ("init_std", lambda c: c.update(initializer_range=float("nan"))),
])
def test_convert_from_hf_refuses_non_finite_numbers_of_config_json(tmp_path, field, edit):
    src = make_random_eurobert(tmp_path / "src")
    _set(src / "config.json", edit)
    out = tmp_path / "out"
    with pytest.raises(UnsupportedModelError, match=rf"HF model 'src': model\.{field} must be a finite number"):
        convert_from_hf(ImportConfig(str(src), out, progress=False))
    assert_untouched(out)


def test_convert_to_hf_refuses_a_nan_checkpoint(tmp_path):
    from safetensors.torch import load_file, save_file

    src = make_tokenizer(make_random_eurobert(tmp_path / "src"))
    weights = load_file(str(src / "model.safetensors"))
    save_file({name: torch.full_like(t, float("nan")) for name, t in weights.items()}, str(src / "model.safetensors"),
              metadata={"format": "pt"})
    convert_from_hf(ImportConfig(str(src), tmp_path / "run", progress=False))
    out = tmp_path / "hf"
    with pytest.raises(CheckpointReadError, match=r"iter_0000000: tensor model\.\S+ holds NaN or infinity: refusing "
                                                  r"to export a model that cannot compute"):
        convert_to_hf(ExportConfig(tmp_path / "run", out, progress=False))
    assert_untouched(out)
