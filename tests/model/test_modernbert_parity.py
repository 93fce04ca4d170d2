"""A tiny random Hugging Face ModernBertForMaskedLM, imported by `convert_from_hf` and exported by `convert_to_hf`,
unchanged: our megatron ModernBERT gives transformers' logits within 1e-5 (CPU, fp32) — bidirectional and causal,
with padding, and with packed documents shorter than the local window attending each to itself; the export (of a
checkpoint written at pipeline parallel 2) is the source tensor for tensor, loads natively (no remote code) and passes the export's own verification."""
import json

import torch

from mlmclm.parallel.launch import spawn
from tests.convert.convert_fixtures import make_tokenizer
from tests.model.modernbert_fixtures import SEQ, save_random_modernbert

DOCUMENTS = [3, 5, 11, 13]  # a packed row of SEQ tokens: two documents shorter than the window, two longer


def _additive(allowed: torch.Tensor) -> torch.Tensor:
    """A [b, 1, q, k] bool "may attend" mask as transformers' eager attention adds it."""
    return torch.where(allowed, 0.0, torch.finfo(torch.float32).min)


def _hf_masks(hf, allowed: torch.Tensor) -> dict:
    """transformers' per-layer-type masks: `allowed` everywhere, and within the window on sliding layers."""
    q = torch.arange(allowed.shape[-1])
    window = (q[:, None] - q[None, :]).abs() <= hf.config.sliding_window
    return {"full_attention": _additive(allowed), "sliding_attention": _additive(allowed & window)}


def _worker(source: str, imported: str, out: str) -> None:
    from dataclasses import replace

    from transformers import ModernBertForMaskedLM

    from mlmclm.model import build_model, set_causal
    from mlmclm.model.document_attention import block_diagonal_mask
    from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel
    from mlmclm.train import checkpoint as ckpt
    from mlmclm.train.config import ModelConfig

    init_parallel(ParallelConfig(), seed=0)
    try:
        path = ckpt.resolve_checkpoint(imported)
        cfg = ModelConfig.from_dict(ckpt.read_json(path, ckpt.RUN_CONFIG)["model"])
        hf = ModernBertForMaskedLM.from_pretrained(source, attn_implementation="eager").eval()
        vocab = cfg.vocab_size

        def ours(model_cfg, tokens, mask=None, causal=False):
            chunks = build_model(model_cfg, ParallelConfig(), causal=causal, use_te=False)
            ckpt.load_weights(path, chunks)
            positions = torch.arange(tokens.shape[1]).expand_as(tokens)
            with torch.no_grad():
                return chunks[0].eval()(tokens, positions, mask)[..., :vocab]

        gen = torch.Generator().manual_seed(1)
        tokens = torch.randint(4, vocab, (2, SEQ), generator=gen)
        r = {}
        with torch.no_grad():
            r["plain"] = (ours(cfg, tokens), hf(input_ids=tokens).logits)
            # Padding: the second row's last 10 tokens are padding, masked as keys; compared where not padding.
            keep = torch.ones(2, SEQ, dtype=torch.bool)
            keep[1, -10:] = False
            padded = ours(cfg, tokens, ~(keep[:, None, None, :].expand(2, 1, SEQ, SEQ)))
            reference = hf(input_ids=tokens, attention_mask=keep.long()).logits
            r["padding"] = (padded[keep], reference[keep])
            # Causal (CLM): transformers' model given causal masks per layer type is the reference.
            causal = torch.ones(SEQ, SEQ, dtype=torch.bool).tril().expand(2, 1, SEQ, SEQ)
            r["causal"] = (ours(cfg, tokens, causal=True), hf(input_ids=tokens, attention_mask=_hf_masks(hf, causal)).logits)
            # Packed documents, per-document attention (our block-diagonal mask), against each document alone.
            ids = torch.repeat_interleave(torch.arange(len(DOCUMENTS)), torch.tensor(DOCUMENTS)).unsqueeze(0)
            row = tokens[:1]
            packed = ours(cfg, row, block_diagonal_mask(ids, causal=False))[0]
            alone = torch.cat([hf(input_ids=part).logits[0] for part in torch.split(row, DOCUMENTS, dim=1)])
            r["documents"] = (packed, alone)
            # The windows and the local θ change the logits: the comparisons above exercise them.
            r["all_global"] = ours(replace(cfg, layer_types=["global"] * cfg.num_layers), tokens)
            r["one_theta"] = ours(replace(cfg, local_rope_theta=cfg.rope_theta), tokens)
        torch.save(r, out)
    finally:
        destroy_parallel()


def test_imported_modernbert_matches_transformers_and_exports_unchanged(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForMaskedLM

    from mlmclm.convert.from_hf import ImportConfig, convert_from_hf
    from mlmclm.convert.to_hf import ExportConfig, convert_to_hf

    source = save_random_modernbert(tmp_path / "source", make_tokenizer(tmp_path / "tokenizer"))
    config = json.loads((source / "config.json").read_text())
    assert config["layer_types"] == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    # Imported at PP 2: the last stage holds megatron's copy of the tied decoder weight, the layer-0 embedding norm
    # and the later layers' norms share one stacked checkpoint key; read back at one process below.
    summary = convert_from_hf(ImportConfig(str(source), tmp_path / "imported", pipeline_parallel=2, progress=False))
    assert summary.model_type == "modernbert" and summary.ignored_tensors == []
    spawn(_worker, 1, str(source), str(tmp_path / "imported"), str(tmp_path / "r.pt"))
    r = torch.load(tmp_path / "r.pt")
    for case in ("plain", "padding", "causal", "documents"):
        ours, theirs = r[case]
        assert (ours - theirs).abs().max() <= 1e-5, (case, (ours - theirs).abs().max())
    for variant in ("all_global", "one_theta"):
        assert (r[variant] - r["plain"][0]).abs().max() > 1e-3, variant
    assert (r["causal"][0] - r["plain"][0]).abs().max() > 1e-3

    export = convert_to_hf(ExportConfig(tmp_path / "imported", tmp_path / "export", verify=True, progress=False))
    assert export.max_abs_diff <= 1e-5
    written, original = load_file(tmp_path / "export" / "model.safetensors"), load_file(source / "model.safetensors")
    assert written.keys() == original.keys()
    assert all(torch.equal(written[k], original[k]) for k in original)
    exported = json.loads((tmp_path / "export" / "config.json").read_text())
    for key in ("architectures", "layer_types", "local_attention", "rope_parameters", "hidden_activation",
                "tie_word_embeddings", "decoder_bias", "norm_eps", "intermediate_size"):
        assert exported.get(key) == config.get(key), key
    assert "auto_map" not in exported
    model = AutoModelForMaskedLM.from_pretrained(tmp_path / "export", trust_remote_code=False)
    assert type(model).__name__ == "ModernBertForMaskedLM"
