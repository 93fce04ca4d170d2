"""Bad input: a clear error naming the cause, non-zero exit from the CLIs, and the output directory untouched."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from convert_fixtures import assert_untouched, hf_kwargs, make_tokenizer, tool_main

from mlmclm.convert.dist_reader import CheckpointReadError
from mlmclm.convert.from_hf import ImportConfig, convert_from_hf
from mlmclm.convert.hf_config import UnsupportedModelError
from mlmclm.convert.hf_source import SourceError
from mlmclm.convert.output import OutputExistsError
from mlmclm.convert.to_hf import ExportConfig, convert_to_hf
from mlmclm.model import ModelConfig
from mlmclm.train.checkpoint_files import CheckpointError

REPO = Path(__file__).resolve().parents[2]
ITER = "iter_0000007"


def export(src, out, **kw):
    return convert_to_hf(ExportConfig(src, out, progress=False, **kw))


@pytest.fixture
def copy_of_checkpoint(tp2pp2_run, tmp_path):
    """A private copy of the run's checkpoint, to damage."""
    run = tmp_path / "run_copy"
    shutil.copytree(tp2pp2_run.run_dir / "checkpoints", run / "checkpoints")
    return run


def _edit_json(path: Path, **changes):
    data = json.loads(path.read_text())
    for key, value in changes.items():
        target = data
        *parents, last = key.split(".")
        for parent in parents:
            target = target[parent]
        target[last] = value
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("damage, error, message", [
    ("not_a_checkpoint", CheckpointError, "holds no checkpoint"),
    ("missing_data_file", CheckpointReadError, "missing its data file"),
    ("truncated_data_file", CheckpointReadError, "torn or corrupted"),
    ("no_metadata_json", CheckpointError, "not a complete checkpoint"),
    ("no_run_config", CheckpointError, "not a complete checkpoint"),
    ("run_config_without_model", CheckpointError, "no `model` section"),
    ("latest_points_nowhere", CheckpointError, "missing or incomplete"),
    ("other_backend", CheckpointError, "only torch_dist"),
    ("config_disagrees_with_tensors", CheckpointReadError, "layers saved"),
    ("wrong_tokenizer", CheckpointError, "not the one the checkpoint was trained with"),
])
def test_bad_checkpoints_are_refused_and_nothing_is_written(copy_of_checkpoint, tmp_path, damage, error, message):
    run = copy_of_checkpoint
    it = run / "checkpoints" / ITER
    source = run
    if damage == "not_a_checkpoint":
        source = tmp_path / "empty"
        source.mkdir()
    elif damage == "missing_data_file":
        next(it.glob("*.distcp")).unlink()
    elif damage == "truncated_data_file":
        for f in it.glob("*.distcp"):
            f.write_bytes(f.read_bytes()[:1000])
    elif damage == "no_metadata_json":
        (it / "metadata.json").unlink()
        source = it
    elif damage == "no_run_config":
        (it / "run_config.json").unlink()
        source = it
    elif damage == "run_config_without_model":
        data = json.loads((it / "run_config.json").read_text())
        del data["model"]
        (it / "run_config.json").write_text(json.dumps(data))
    elif damage == "latest_points_nowhere":
        (run / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("99")
    elif damage == "other_backend":
        (it / "metadata.json").write_text(json.dumps({"sharded_backend": "zarr", "sharded_backend_version": 1}))
    elif damage == "config_disagrees_with_tensors":
        _edit_json(it / "run_config.json", **{"model.num_layers": 2})
    elif damage == "wrong_tokenizer":
        _edit_json(it / "train_state.json", **{"tokenizer.vocab_hash": "0" * 64})
    out = tmp_path / "out"
    with pytest.raises(error, match=message):
        export(source, out)
    assert_untouched(out)


def test_existing_output_is_kept_unless_forced(tp2pp2_run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="--force"):
        export(tp2pp2_run.run_dir, out)
    assert_untouched(out, ["keep.txt"])
    export(tp2pp2_run.run_dir, out, force=True)
    assert (out / "config.json").exists() and not (out / "keep.txt").exists()
    assert_untouched(out, sorted(p.name for p in out.iterdir()))


def _llama_dir(path: Path, seed=0, base_model=False, **config) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaModel

    shape = ModelConfig(num_layers=1, hidden_size=32, num_attention_heads=2, num_kv_heads=2, ffn_hidden_size=64,
                        vocab_size=50, max_position_embeddings=32)
    kwargs = {**hf_kwargs(shape), "tie_word_embeddings": False, **config}
    torch.manual_seed(seed)
    model = (LlamaModel if base_model else LlamaForCausalLM)(LlamaConfig(**kwargs))
    model.save_pretrained(str(path))
    return path


@pytest.mark.parametrize("case, error, message", [
    ("qkv_bias", UnsupportedModelError, "biases"),
    ("yarn_rope", UnsupportedModelError, "'yarn' is not supported"),
    ("llama3_other_low_freq", UnsupportedModelError, "low_freq_factor"),
    ("no_lm_head", SourceError, "without an LM head"),
    ("unsupported_model_type", UnsupportedModelError, "model_type 'qwen2' is not supported"),
    ("not_a_directory", SourceError, "not a model directory"),
    ("tp_splits_kv_heads", ValueError, "num_kv_heads 2 is not divisible by tensor_parallel 4"),
    ("broken_tokenizer", SourceError, r"src: the tokenizer \(tokenizer.json.*JSONDecodeError"),
])
def test_bad_hf_sources_are_refused_and_nothing_is_written(tmp_path, case, error, message):
    src = tmp_path / "src"
    tp = 1
    if case == "qkv_bias":
        _llama_dir(src, attention_bias=True)
    elif case == "yarn_rope":
        _llama_dir(src, rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                         "original_max_position_embeddings": 16})
    elif case == "llama3_other_low_freq":
        _llama_dir(src, max_position_embeddings=16384,
                   rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 2.0,
                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    elif case == "no_lm_head":
        _llama_dir(src, base_model=True)
    elif case == "unsupported_model_type":
        from transformers import Qwen2Config, Qwen2ForCausalLM

        Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     num_key_value_heads=2, intermediate_size=64)).save_pretrained(str(src))
    elif case == "not_a_directory":
        src = tmp_path / "nothing" / "here"
    elif case == "tp_splits_kv_heads":
        _llama_dir(src, num_attention_heads=4)
        tp = 4
    elif case == "broken_tokenizer":
        _broken_tokenizer(_llama_dir(src))
    out = tmp_path / "out"
    with pytest.raises(error, match=message):
        convert_from_hf(ImportConfig(str(src), out, tensor_parallel=tp, progress=False))
    assert_untouched(out)


def _broken_tokenizer(directory: Path) -> Path:
    """A model directory whose tokenizer.json is truncated (an interrupted download)."""
    make_tokenizer(directory)
    tok = directory / "tokenizer.json"
    tok.write_text(tok.read_text()[:300])
    return directory


def test_a_source_without_tokenizer_files_gets_a_warning_not_an_error(tmp_path, caplog):
    from mlmclm.convert.from_hf import load_source_tokenizer

    src = _llama_dir(tmp_path / "weights_only")
    with caplog.at_level("WARNING"):
        assert load_source_tokenizer(src) is None
    assert "has no tokenizer" in caplog.text and str(src) in caplog.text and "--tokenizer" in caplog.text
    assert load_source_tokenizer(make_tokenizer(src)) is not None


def test_clis_exit_non_zero_with_the_error_and_write_nothing(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    biased = _llama_dir(tmp_path / "biased", attention_bias=True)
    broken_tok = _broken_tokenizer(_llama_dir(tmp_path / "broken_tok"))
    for tool, source, message in (("convert_to_hf", empty, "holds no checkpoint"),
                                  ("convert_from_hf", biased, "biases"),
                                  ("convert_from_hf", broken_tok, f"{broken_tok}: the tokenizer (tokenizer.json")):
        out = tmp_path / f"out_{tool}"
        assert tool_main(tool)([str(source), str(out)]) == 2
        err = capsys.readouterr().err
        assert "error:" in err and message in err
        assert_untouched(out)


def test_cli_exports_and_prints_a_summary(tp2pp2_run, tmp_path):
    out = tmp_path / "hf"
    proc = subprocess.run([sys.executable, "tools/convert_to_hf.py", str(tp2pp2_run.run_dir), str(out), "--dtype",
                           "bf16"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "parameters:" in proc.stdout and "dtype: bf16" in proc.stdout and "output size" in proc.stdout
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"


def test_an_export_onto_a_full_disk_names_the_file_and_the_os_words(tp2pp2_run, tmp_path, capsys):
    """A real 16 kB tmpfs (root only) is too small for the model: the CLI says the OS's words ('No space left on
    device') instead of a traceback, exits 1 and publishes nothing."""
    import os

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(small)], check=True)
    try:
        rc = tool_main("convert_to_hf")([str(tp2pp2_run.run_dir), str(small / "hf")])
        err = capsys.readouterr().err
        assert rc == 1, err
        assert "error: No space left on device (nothing was published" in err and "Traceback" not in err, err
        assert not (small / "hf").exists()
    finally:
        subprocess.run(["umount", "-l", str(small)], check=True)
