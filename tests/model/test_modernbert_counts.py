"""ModernBERT in the plans: the FLOPs count its local layers' windows, the memory plan its tied decoder and head,
and its presets are ModernBERT's own shapes (checked against transformers' ModernBertConfig)."""
import pytest
import torch

from mlmclm.flops import flop_breakdown, flops_for_lengths, flops_per_token, windowed_keys_per_query
from mlmclm.model import preset
from mlmclm.model.memory import RankLayout, parameters_per_rank


def _brute_keys(seq: int, half_window: int, causal: bool) -> float:
    q = torch.arange(seq)
    seen = (q[:, None] - q[None, :]).abs() <= half_window
    if causal:
        seen &= q[None, :] <= q[:, None]
    return seen.sum().item() / seq


@pytest.mark.parametrize("seq, window", [(1, 4), (5, 4), (6, 4), (7, 64), (300, 64), (8192, 64)])
def test_windowed_keys_per_query_counts_the_keys_a_query_sees(seq, window):
    for causal in (False, True):
        assert windowed_keys_per_query(seq, window, causal) == pytest.approx(_brute_keys(seq, window, causal))


def test_local_layers_attention_flops_follow_the_window():
    model = preset("modernbert-base")
    h, local = model.hidden_size, model.layer_types.count("local")
    assert (local, model.num_layers - local) == (14, 8) and model.half_window == 64
    for seq in (512, 8192):
        keys = (model.num_layers - local) * seq + local * _brute_keys(seq, 64, causal=False)
        assert flop_breakdown(model, seq).attention == pytest.approx(2 * keys * h)
    # at 8,192 tokens the 14 local layers cost ~1/60 of a global layer's attention each
    everywhere = preset("modernbert-base", layer_types=["global"] * model.num_layers)
    assert flop_breakdown(model, 8192).attention < 0.4 * flop_breakdown(everywhere, 8192).attention
    assert flop_breakdown(model, 8192).head_transform == h * h
    # random-length samples: each distinct length counted, the sum over samples as one row each
    lengths = [12, 100, 100, 2048]
    assert flops_for_lengths(model, lengths) == pytest.approx(sum(flops_per_token(model, n) * n for n in lengths))


def test_modernbert_presets_are_transformers_shapes_and_the_plan_counts_their_parameters():
    from transformers import ModernBertConfig, ModernBertForMaskedLM

    model = preset("modernbert-base")
    reference = ModernBertConfig()  # transformers' defaults are ModernBERT-base's
    assert (model.num_layers, model.hidden_size, model.num_attention_heads, model.ffn_hidden_size,
            model.vocab_size, model.max_position_embeddings, model.local_attention) == \
        (reference.num_hidden_layers, reference.hidden_size, reference.num_attention_heads,
         reference.intermediate_size, reference.vocab_size, reference.max_position_embeddings,
         reference.local_attention)
    assert [t == "local" for t in model.layer_types] == [t == "sliding_attention" for t in reference.layer_types]
    assert (model.rope_theta, model.local_rope_theta) == (reference.rope_parameters["full_attention"]["rope_theta"],
                                                          reference.rope_parameters["sliding_attention"]["rope_theta"])
    with torch.device("meta"):
        hf = ModernBertForMaskedLM(reference)
    # one rank holds the whole model: the tied decoder counted once, the head's dense layer and bias included
    assert parameters_per_rank(model, RankLayout()) == sum(p.numel() for p in hf.parameters())
