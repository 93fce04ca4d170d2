"""A RoPE θ switch in place: after it the model computes exactly what a model built with the new θ computes from
the same weights (megatron's RotaryEmbedding caches its embeddings per length: a switch must not reuse them)."""
import json
from dataclasses import replace

import torch

from mlmclm.model import ModelConfig, build_model, rope_theta, set_rope_theta
from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel
from mlmclm.parallel.launch import spawn

SHAPE = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                    vocab_size=200, max_position_embeddings=64, rope_theta=10_000.0, make_vocab_divisible_by=64)
LONG = replace(SHAPE, rope_theta=160_000.0)
SCALED = replace(SHAPE, rope_scaling={"factor": 4.0})


def _logits(chunks, tokens):
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    with torch.no_grad():
        return chunks[0](tokens, positions, None).float()


def _run(out_path):
    init_parallel(ParallelConfig(), seed=5)
    try:
        tokens = torch.randint(0, 200, (2, 40), generator=torch.Generator().manual_seed(0))
        report = {}
        for name, before, after in (("plain", SHAPE, LONG), ("llama3-scaled", SCALED, replace(SCALED, rope_theta=1e6))):
            switched = build_model(before, ParallelConfig())
            old = _logits(switched, tokens)          # fills megatron's cache for this length with the old θ
            set_rope_theta(switched, after)
            new = _logits(switched, tokens)
            built = build_model(after, ParallelConfig())
            built[0].load_state_dict(switched[0].state_dict())
            reference = _logits(built, tokens)
            report[name] = {"switched_vs_built": (new - reference).abs().max().item(),
                            "old_vs_new": (old - new).abs().max().item(), "theta": rope_theta(switched),
                            "weights_equal": all(torch.equal(a, b) for a, b in
                                                 zip(switched[0].state_dict().values(), built[0].state_dict().values())
                                                 if isinstance(a, torch.Tensor))}
        out_path.write_text(json.dumps(report))
    finally:
        destroy_parallel()


def test_after_a_theta_switch_the_model_equals_one_built_with_the_new_theta(tmp_path):
    out = tmp_path / "report.json"
    spawn(_run, 1, out)
    report = json.loads(out.read_text())
    for name, figures in report.items():
        assert figures["weights_equal"], name
        assert figures["switched_vs_built"] == 0.0, (name, figures)   # the same frequencies, the same kernels
        assert figures["old_vs_new"] > 1e-3, (name, figures)          # and θ really changed what is computed
    assert report["plain"]["theta"] == 160_000.0 and report["llama3-scaled"]["theta"] == 1e6
