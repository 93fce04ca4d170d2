"""TP=2×PP=2 training checkpoint → HF EuroBERT → back to a TP=1 megatron checkpoint: same weights, same logits."""
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from convert_fixtures import SHAPE, megatron_logits_worker, read_json
from safetensors.torch import load_file

from mlmclm.convert.from_hf import ImportConfig, convert_from_hf
from mlmclm.convert.to_hf import ExportConfig, ExportSummary, convert_to_hf
from mlmclm.parallel.launch import spawn


@dataclass
class RoundTrip:
    hf_dir: Path
    summary: ExportSummary
    back: Path
    tokens: torch.Tensor
    logits_checkpoint: torch.Tensor  # our model, weights from the TP2×PP2 checkpoint
    logits_round_trip: torch.Tensor  # our model, weights from checkpoint → HF → TP=1 checkpoint


@pytest.fixture(scope="module")
def round_trip(tp2pp2_run, tmp_path_factory) -> RoundTrip:
    tmp = tmp_path_factory.mktemp("round_trip")
    hf_dir = tmp / "hf"
    summary = convert_to_hf(ExportConfig(tp2pp2_run.run_dir, hf_dir, verify=True, progress=False))
    back = tmp / "megatron_tp1"
    convert_from_hf(ImportConfig(str(hf_dir), back, progress=False))
    tokens = torch.randint(0, SHAPE.vocab_size, (3, 24), generator=torch.Generator().manual_seed(5))
    torch.save(tokens, tmp / "tokens.pt")
    spawn(megatron_logits_worker, 1, [str(tp2pp2_run.run_dir), str(back)], str(tmp / "tokens.pt"),
          str(tmp / "logits.pt"), False)
    before, after = torch.load(tmp / "logits.pt")
    return RoundTrip(hf_dir, summary, back, tokens, before, after)


def test_round_trip_preserves_weights_and_logits(tp2pp2_run, round_trip):
    # --verify compared logits on the exported files before they were published.
    assert round_trip.summary.max_abs_diff is not None and round_trip.summary.max_abs_diff <= 1e-5
    assert round_trip.summary.source_layout == {"tp": 2, "pp": 2, "dp": 1}
    # Every HF tensor comes back bit-identical to the model the checkpoint was made from (fp32 all the way).
    original = load_file(str(tp2pp2_run.hf_source / "model.safetensors"))
    exported = load_file(str(round_trip.hf_dir / "model.safetensors"))
    assert sorted(original) == sorted(exported)
    for name in original:
        assert torch.equal(original[name], exported[name]), name
    assert round_trip.logits_checkpoint.shape == (3, 24, SHAPE.vocab_size)
    assert torch.equal(round_trip.logits_checkpoint, round_trip.logits_round_trip)
    # The re-imported checkpoint records where it came from and carries the run's tokenizer.
    state = read_json(round_trip.back / "checkpoints" / "iter_0000000" / "train_state.json")
    assert state["converted_from"]["model_type"] == "eurobert"
    assert state["tokenizer"]["vocab_hash"] == read_json(
        tp2pp2_run.run_dir / "checkpoints" / "iter_0000007" / "train_state.json")["tokenizer"]["vocab_hash"]


def test_hf_logits_match_ours_and_fill_mask_works(round_trip):
    from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

    hf_dir = round_trip.hf_dir
    model = AutoModelForMaskedLM.from_pretrained(str(hf_dir)).eval()
    with torch.no_grad():
        theirs = model(input_ids=round_trip.tokens).logits
    assert (round_trip.logits_checkpoint - theirs).abs().max().item() <= 1e-5

    tok = AutoTokenizer.from_pretrained(str(hf_dir))
    config = read_json(hf_dir / "config.json")
    assert config["model_type"] == "eurobert" and config["tie_word_embeddings"] is False
    assert config["mask_token_id"] == tok.mask_token_id == 2
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (0, 1, 3)
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": SHAPE.rope_theta}
    assert (config["num_hidden_layers"], config["num_key_value_heads"], config["intermediate_size"]) == (4, 2, 96)

    fill = pipeline("fill-mask", model=str(hf_dir), tokenizer=str(hf_dir))
    predictions = fill(f"the cat {tok.mask_token} on the mat", top_k=3)
    assert len(predictions) == 3 and all("token_str" in p and "score" in p for p in predictions)

    card = (hf_dir / "README.md").read_text()
    for expected in ("run", "iteration 7", "CLM", "MLM", str(7 * 4 * 32), "bidirectional"):
        assert expected in card, expected


def test_bf16_export_in_several_shards_loads_as_rounded_weights(tp2pp2_run, tmp_path):
    from transformers import AutoModelForMaskedLM

    hf_dir = tmp_path / "hf_bf16"
    summary = convert_to_hf(ExportConfig(tp2pp2_run.run_dir / "checkpoints" / "iter_0000007", hf_dir, dtype="bf16",
                                         max_shard_bytes=40_000, progress=False))
    index = read_json(hf_dir / "model.safetensors.index.json")
    assert len(summary.files) > 1 and set(index["weight_map"].values()) == set(summary.files)
    assert not (hf_dir / "model.safetensors").exists()
    model = AutoModelForMaskedLM.from_pretrained(str(hf_dir), dtype=torch.bfloat16)
    original = load_file(str(tp2pp2_run.hf_source / "model.safetensors"))
    state = model.state_dict()
    for name, tensor in original.items():
        assert state[name].dtype == torch.bfloat16
        assert torch.equal(state[name], tensor.to(torch.bfloat16)), name


def test_export_checkpoint_api_returns_the_output(tp2pp2_run, tmp_path):
    from mlmclm.convert.to_hf import export_checkpoint

    out = export_checkpoint(tp2pp2_run.run_dir / "checkpoints" / "iter_0000007", tmp_path / "exported" / "iter_7")
    assert out == tmp_path / "exported" / "iter_7" and (out / "config.json").exists()
    assert (out / "tokenizer.json").exists() and (out / "model.safetensors").exists()


def test_interleaved_pipeline_checkpoint_exports_the_same_weights(tp2pp2_run, tmp_path):
    """HF → megatron at PP=2 × VPP=2 (layers interleaved over chunks) → HF gives back every tensor unchanged."""
    megatron = tmp_path / "pp2vpp2"
    convert_from_hf(ImportConfig(str(tp2pp2_run.hf_source), megatron, pipeline_parallel=2,
                                 virtual_pipeline_parallel=2, progress=False))
    hf_dir = tmp_path / "hf"
    convert_to_hf(ExportConfig(megatron, hf_dir, tokenizer=str(tp2pp2_run.tokenizer), progress=False))
    original = load_file(str(tp2pp2_run.hf_source / "model.safetensors"))
    exported = load_file(str(hf_dir / "model.safetensors"))
    assert sorted(original) == sorted(exported)
    for name in original:
        assert torch.equal(original[name], exported[name]), name
