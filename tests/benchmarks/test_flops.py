"""FLOP accounting against a hand computation, the peak table lookup, and MFU."""
import pytest

from mlmclm.flops import flop_breakdown, flops_per_step, flops_per_token, mfu, peak_flops
from mlmclm.model import ModelConfig

# L=2 layers, h=64, 4 query heads of head_dim 16, 2 KV heads (KV width 32), ffn 128, vocab 256 (already a multiple
# of 64, so padding changes nothing), sequence length S=32.
SHAPE = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=128,
                    vocab_size=256, max_position_embeddings=64, make_vocab_divisible_by=64)
S = 32

# Per layer, per token, multiply-adds:
Q = 64 * 64                # 4096
KV = 2 * 64 * (2 * 16)     # k and v: 4096
OUT = 64 * 64              # 4096
MLP = 3 * 64 * 128         # 24576
ATT_BIDIR = 2 * S * 64     # QK^T and AV over all 32 keys: 4096
ATT_CAUSAL = 2 * (S // 2) * 64  # half the keys when the kernel skips masked blocks: 2048
HEAD = 64 * 256            # once per token: 16384


def test_bidirectional_matches_hand_computation():
    macs = 2 * (Q + KV + OUT + MLP + ATT_BIDIR) + HEAD   # 2·40960 + 16384 = 98304
    assert macs == 98304
    assert flops_per_token(SHAPE, S, causal=False, training=False) == 2 * macs        # 196608
    assert flops_per_token(SHAPE, S, causal=False) == 3 * 2 * macs                    # 589824


def test_causal_counts_half_the_attention_by_default():
    macs = 2 * (Q + KV + OUT + MLP + ATT_CAUSAL) + HEAD  # 2·38912 + 16384 = 94208
    assert macs == 94208
    assert flops_per_token(SHAPE, S, causal=True) == 6 * macs                         # 565248
    # With the flag off, causal costs what bidirectional does (a kernel that computes the full score matrix).
    assert flops_per_token(SHAPE, S, causal=True, causal_attention_half=False) == flops_per_token(SHAPE, S)


def test_breakdown_components_and_predicted_only_head():
    b = flop_breakdown(SHAPE, S)
    assert (b.qkv, b.attention_output, b.mlp, b.attention, b.lm_head) == (2 * (Q + KV), 2 * OUT, 2 * MLP,
                                                                          2 * ATT_BIDIR, HEAD)
    # Gather-before-head with 25 % of positions predicted: the head costs a quarter.
    assert flop_breakdown(SHAPE, S, lm_head_fraction=0.25).lm_head == HEAD / 4
    assert flops_per_step(SHAPE, S, sequences_per_step=3) == flops_per_token(SHAPE, S) * S * 3


def test_padded_vocabulary_is_the_default_head_width():
    odd = SHAPE.with_overrides(vocab_size=200)  # padded to 256
    assert flop_breakdown(odd, S).lm_head == 64 * 256
    assert flop_breakdown(odd, S, vocab_size=200).lm_head == 64 * 200


def test_gqa_shrinks_kv_projection_only():
    mha = SHAPE.with_overrides(num_kv_heads=4)
    assert flop_breakdown(mha, S).qkv - flop_breakdown(SHAPE, S).qkv == 2 * 2 * 64 * 32  # 2 layers × k,v × h × 32
    assert flop_breakdown(mha, S).attention == flop_breakdown(SHAPE, S).attention


def test_peak_lookup_by_device_name():
    assert peak_flops("bf16", device_name="NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops("fp8", device_name="NVIDIA H100 80GB HBM3") == 1979e12
    assert peak_flops("bf16", device_name="NVIDIA H200") == 989e12
    assert peak_flops("bf16", device_name="NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops("bf16", device_name="NVIDIA H100 PCIe") == 756e12
    with pytest.raises(ValueError, match="no fp8 peak"):
        peak_flops("fp8", device_name="NVIDIA A100-SXM4-80GB")
    with pytest.raises(ValueError, match="unknown GPU"):
        peak_flops("bf16", device_name="Some Future GPU")
    assert peak_flops("bf16", device_name="Some Future GPU", override=5e14) == 5e14


def test_mfu():
    # 10 000 tokens/s × 6e9 FLOP/token = 6e13 FLOP/s on a 1.2e14 peak: 50 %.
    assert mfu(10_000, 6e9, 1.2e14) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        mfu(1.0, 1.0, 0.0)


def test_mlm_counts_the_head_at_masked_positions_only():
    from mlmclm.flops import lm_head_fraction
    from mlmclm.objectives import ObjectiveConfig

    assert lm_head_fraction(ObjectiveConfig("clm")) == 1.0
    assert lm_head_fraction(ObjectiveConfig("mlm", mask_ratio=0.4)) == 0.4
    mlm = flops_per_token(SHAPE, S, lm_head_fraction=lm_head_fraction(ObjectiveConfig("mlm", mask_ratio=0.25)))
    assert mlm == 6 * (2 * (Q + KV + OUT + MLP + ATT_BIDIR) + HEAD / 4)


def test_random_length_steps_count_each_samples_own_attention_length():
    """Random-length samples attend within themselves: a step costs the sum of each sample's FLOPs at its own
    length — not micro_batch × seq_length — and the plan's expectation is the mean of that over the lengths."""
    from mlmclm.flops import flops_for_lengths, flops_per_step, mean_flops_for_uniform_lengths
    from mlmclm.model.config import preset

    model = preset("eurobert-210m")
    lengths = [12, 700, 2048, 1030]
    for kwargs in ({"causal": True}, {"causal": False, "lm_head_fraction": 0.4}):
        expected = sum(flops_per_step(model, n, 1, **kwargs) for n in lengths)
        assert flops_for_lengths(model, lengths, **kwargs) == pytest.approx(expected, rel=1e-12)
        assert flops_for_lengths(model, lengths, **kwargs) < flops_per_step(model, 2048, len(lengths), **kwargs)
    uniform = [flops_for_lengths(model, [n]) for n in range(12, 2049)]
    assert mean_flops_for_uniform_lengths(model, 12, 2048, 2304) == pytest.approx(2304 * sum(uniform) / len(uniform),
                                                                                rel=1e-12)
