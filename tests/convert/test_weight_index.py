"""convert_from_hf reads a sharded model through its model.safetensors.index.json, a file from others: the files
its weight_map names stay inside the model directory, and the index itself is read bounded."""
import json
import os
import shutil

import pytest
import torch
from convert_fixtures import assert_untouched, hf_kwargs

from mlmclm.convert.from_hf import ImportConfig, convert_from_hf
from mlmclm.convert.hf_source import SourceError
from mlmclm.model import ModelConfig


def _sharded_llama(path):
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=2, num_kv_heads=2, ffn_hidden_size=64,
                        vocab_size=50, max_position_embeddings=32)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**hf_kwargs(shape), tie_word_embeddings=False)).save_pretrained(
        str(path), max_shard_size="8KB")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1   # really sharded
    return path, index


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["parent", "absolute", "dotdot_inside"])
def test_a_weight_map_naming_files_outside_the_model_is_refused(tmp_path, where):
    """On the old code the index was followed: a weight_map entry '../outside.safetensors' (or an absolute path)
    read a file outside the model directory, and the conversion succeeded with its tensors."""
    src, index = _sharded_llama(tmp_path / "src")
    name, shard = next(iter(index["weight_map"].items()))
    outside = tmp_path / "outside.safetensors"
    shutil.copy(src / shard, outside)
    planted = {"parent": "../outside.safetensors", "absolute": str(outside),
               "dotdot_inside": "sub/../../outside.safetensors"}[where]
    index["weight_map"] = {k: (planted if v == shard else v) for k, v in index["weight_map"].items()}
    (src / shard).unlink()
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    out = tmp_path / "out"
    with pytest.raises(SourceError, match=rf"model.safetensors.index.json: weight_map\[.*\] names "
                                          rf"'{planted}', not a file inside .*src"):
        convert_from_hf(ImportConfig(str(src), out, progress=False))
    assert_untouched(out)


@pytest.mark.timeout(60)
def test_an_index_or_weight_file_that_is_a_fifo_is_refused(tmp_path):
    src, index = _sharded_llama(tmp_path / "src")
    shard = next(iter(index["weight_map"].values()))
    (src / shard).unlink()
    os.mkfifo(src / shard)
    with pytest.raises(SourceError, match=rf"{shard}: refusing to read this weight file: it is a FIFO"):
        convert_from_hf(ImportConfig(str(src), tmp_path / "out", progress=False))
    (src / "model.safetensors.index.json").unlink()
    os.mkfifo(src / "model.safetensors.index.json")
    with pytest.raises(SourceError, match="model.safetensors.index.json: refusing to read this weight index: it is "
                                          "a FIFO"):
        convert_from_hf(ImportConfig(str(src), tmp_path / "out", progress=False))
