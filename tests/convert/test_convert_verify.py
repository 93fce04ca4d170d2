"""`--verify` rejects a corrupted export, naming what differs (config field, tensor), and publishes nothing."""
import json
import shutil
from pathlib import Path

import pytest
from convert_fixtures import SHAPE, assert_untouched, tool_main
from safetensors.torch import load_file, save_file

from mlmclm.convert.output import SafetensorsStreamWriter
from mlmclm.convert.to_hf import ExportConfig, convert_to_hf, open_checkpoint
from mlmclm.convert.verify import VerificationError, sample_tokens, verify_export

EMBED = "model.embed_tokens.weight"


def unsampled_token() -> int:
    """A token id the logits comparison never feeds the model: a corrupt embedding row there moves no logit."""
    return min(set(range(SHAPE.vocab_size)) - set(sample_tokens(SHAPE.vocab_size,
                                                                SHAPE.max_position_embeddings).flatten().tolist()))


@pytest.fixture(scope="module")
def export(tp2pp2_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("verify") / "hf"
    convert_to_hf(ExportConfig(tp2pp2_run.run_dir, out, progress=False))
    return out


def _edit_tensors(hf_dir: Path, edit) -> None:
    tensors = load_file(str(hf_dir / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})


def _perturb_row(tensors):
    tensors[EMBED][unsampled_token(), 0] += 1e-3


def _transpose_o_proj(tensors):
    name = "model.layers.1.self_attn.o_proj.weight"  # square (hidden × heads·head_dim): loads without complaint
    tensors[name] = tensors[name].T.contiguous()


def _drop_tensor(tensors):
    del tensors["model.layers.2.mlp.up_proj.weight"]


def _wrong_mask_id(hf_dir: Path):
    config = json.loads((hf_dir / "config.json").read_text())
    config["mask_token_id"] = 3
    (hf_dir / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("damage, message", [
    (lambda d: _edit_tensors(d, _perturb_row),
     rf"{EMBED}: 1 of 12800 values differ, first at \({unsampled_token()}, 0\), max \|diff\| 1\.0"),
    (lambda d: _edit_tensors(d, _transpose_o_proj),
     r"model\.layers\.1\.self_attn\.o_proj\.weight: .* \(it is the expected tensor transposed\)"),
    (lambda d: _edit_tensors(d, _drop_tensor), r"missing tensors: \['model\.layers\.2\.mlp\.up_proj\.weight'\]"),
    (_wrong_mask_id, r"config\.json differs .*: mask_token_id: 3 \(written\) != 2 \(checkpoint\)"),
], ids=["perturbed_embedding_row", "transposed_weight", "missing_tensor", "wrong_config_field"])
def test_verify_names_what_differs_in_a_corrupted_export(tp2pp2_run, export, tmp_path, damage, message):
    corrupted = tmp_path / "hf"
    shutil.copytree(export, corrupted)
    damage(corrupted)
    source = open_checkpoint(tp2pp2_run.run_dir)
    with pytest.raises(VerificationError, match=message):
        verify_export(source.path, corrupted, source.model, source.train_state["tokenizer"])


def test_cli_verify_refuses_a_corrupted_write_and_publishes_nothing(tp2pp2_run, tmp_path, capsys, monkeypatch):
    # A fault injected into the writer (as a disk or a writer bug would): one value of an embedding row the logits
    # check never feeds. The logits alone agree within tolerance; --verify must still refuse the export.
    write = SafetensorsStreamWriter.write

    def corrupting_write(self, name, tensor):
        if name == EMBED:
            tensor = tensor.clone()
            tensor[unsampled_token(), 0] += 1e-3
        write(self, name, tensor)

    monkeypatch.setattr(SafetensorsStreamWriter, "write", corrupting_write)
    out = tmp_path / "hf"
    assert tool_main("convert_to_hf")([str(tp2pp2_run.run_dir), str(out), "--verify"]) == 2
    err = capsys.readouterr().err
    assert f"error: verification of the export to {out} failed" in err
    assert f"{EMBED}: 1 of 12800 values differ" in err and "nothing was written there" in err
    assert_untouched(out)
