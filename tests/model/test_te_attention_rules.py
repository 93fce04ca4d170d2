"""Our use of Transformer Engine's attention, checked against a stand-in enforcing TE's contract
(tests/stand_ins/te/transformer_engine/pytorch/attention/dot_product_attention.py): the phase switch sets TE's
attention window, packed segments refuse the unfused THD RoPE, and the THD inputs we build are what TE accepts."""
import pytest
import torch

from tests.stand_ins import transformer_engine_stand_in

from mlmclm.model import ModelConfig, set_causal
from mlmclm.model.document_attention import DocumentLayout, packed_seq_params

SHAPE = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                    vocab_size=256, max_position_embeddings=64)


@pytest.fixture
def te_attention():
    with transformer_engine_stand_in.on_path():
        from transformer_engine.pytorch.attention import dot_product_attention

        dot_product_attention.window_warnings.clear()
        yield dot_product_attention


def _qkv(tokens, heads=4, groups=2, dim=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(tokens, heads, dim, generator=gen), torch.randn(tokens, groups, dim, generator=gen),
            torch.randn(tokens, groups, dim, generator=gen))


def test_the_phase_switch_sets_tes_attention_window(te_attention):
    """A model built causal (CLM first) switched to MLM: TE keeps the window of its construction, (-1, 0), and
    would correct it with a warning at every MLM call; `set_causal` sets it (old code: a warning per call)."""
    chunk = torch.nn.Module()
    chunk.core_attention = te_attention.DotProductAttention(4, 16, num_gqa_groups=2, attn_mask_type="causal")
    assert chunk.core_attention.window_size == (-1, 0)
    layout = DocumentLayout.from_document_ids(torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2]]))
    params = packed_seq_params(layout)
    q, k, v = _qkv(8)
    for causal, mask_type in ((False, "padding"), (True, "padding_causal"), (False, "padding")):
        set_causal([chunk], causal)
        chunk.core_attention(q, k, v, None, qkv_format="thd", attn_mask_type=mask_type,
                             cu_seqlens_q=params.cu_seqlens_q, cu_seqlens_kv=params.cu_seqlens_kv,
                             max_seqlen_q=params.max_seqlen_q, max_seqlen_kv=params.max_seqlen_kv)
        assert chunk.core_attention.window_size == ((-1, 0) if causal else (-1, -1))
    assert te_attention.window_warnings == []


def test_our_thd_inputs_meet_tes_contract_and_equal_each_segment_alone(te_attention):
    layout = DocumentLayout.from_document_ids(torch.tensor([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1]]))
    params = packed_seq_params(layout)
    attention = te_attention.DotProductAttention(4, 16, num_gqa_groups=2, attn_mask_type="padding_causal")
    q, k, v = _qkv(10)
    out = attention(q, k, v, None, qkv_format="thd", cu_seqlens_q=params.cu_seqlens_q,
                    cu_seqlens_kv=params.cu_seqlens_kv, max_seqlen_q=params.max_seqlen_q,
                    max_seqlen_kv=params.max_seqlen_kv)
    bounds = params.cu_seqlens_q.tolist()
    for a, b in zip(bounds, bounds[1:]):
        alone = attention(q[a:b, None], k[a:b, None], v[a:b, None], qkv_format="sbhd", attn_mask_type="causal")
        assert torch.allclose(out[a:b], alone[:, 0], atol=1e-6)
    kwargs = dict(qkv_format="thd", cu_seqlens_q=params.cu_seqlens_q, cu_seqlens_kv=params.cu_seqlens_kv,
                  max_seqlen_q=params.max_seqlen_q, max_seqlen_kv=params.max_seqlen_kv)
    with pytest.raises(AssertionError, match="padding or padding_causal"):
        attention(q, k, v, **{**kwargs, "attn_mask_type": "causal"})
    wide = params.cu_seqlens_q.long()
    with pytest.raises(AssertionError, match="dtype torch.int32"):
        attention(q, k, v, **{**kwargs, "cu_seqlens_q": wide, "cu_seqlens_kv": wide})
    with pytest.raises(TypeError, match="host int"):
        attention(q, k, v, **{**kwargs, "max_seqlen_q": torch.tensor(3)})


def test_packed_segments_on_te_refuse_the_unfused_thd_rope(monkeypatch):
    """megatron's unfused THD RoPE reads cu_seqlens from the device in every layer: refused, with the cause."""
    from mlmclm.model import fusions
    from mlmclm.model.build import transformer_config
    from mlmclm.parallel import ParallelConfig

    without_rope = fusions.KernelAvailability(gpu=None, apex_softmax="absent", apex_wgrad="absent",
                                              jit_fuser="absent", te_rope="TE fused RoPE not importable")
    monkeypatch.setattr(fusions, "probe_kernels", lambda: without_rope)
    with pytest.raises(ValueError, match="fused THD RoPE.*synchronises with the host in every layer"):
        transformer_config(SHAPE, ParallelConfig(), use_te=True, packed_segments=True)
    transformer_config(SHAPE, ParallelConfig(), use_te=True, packed_segments=False)  # sbhd: no per-layer reads
    with_rope = fusions.KernelAvailability(gpu=None, apex_softmax="absent", apex_wgrad="absent",
                                           jit_fuser="absent", te_rope=None)
    monkeypatch.setattr(fusions, "probe_kernels", lambda: with_rope)
    # Past our check: what stops it now is megatron's own (no real TE in this process), not the refusal above.
    with pytest.raises(ValueError, match="apply_rope_fusion is not available. Please install TE"):
        transformer_config(SHAPE, ParallelConfig(), use_te=True, packed_segments=True)


def test_the_fused_thd_rope_stand_in_restarts_positions_per_segment_as_megatron_expects(te_attention):
    """The stand-in of TE's fused THD RoPE against megatron's own unfused THD RoPE (`rope_utils`, the path it
    replaces) on our layout: equal, positions restarting at every segment; and TE's cu_seqlens contract."""
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_thd

    from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb

    layout = DocumentLayout.from_document_ids(torch.tensor([[0, 0, 0, 1, 1], [0, 1, 1, 1, 1]]))
    # megatron's RotaryEmbedding table (non-interleaved): [positions, 1, 1, dim], each frequency twice
    inv_freq = 1.0 / (500 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))
    angles = torch.outer(torch.arange(layout.max_seqlen, dtype=torch.float32), inv_freq)
    freqs = torch.cat((angles, angles), dim=-1)[:, None, None, :]
    t = torch.randn(10, 4, 16, generator=torch.Generator().manual_seed(2))
    fused = apply_rotary_pos_emb(t, freqs, tensor_format="thd", fused=True, cu_seqlens=layout.cu_seqlens)
    class NoContextParallelism:  # megatron reads only the CP group's size and rank here
        def size(self):
            return 1

        def rank(self):
            return 0

    unfused = _apply_rotary_pos_emb_thd(t, layout.cu_seqlens, freqs, cp_group=NoContextParallelism())
    assert torch.allclose(fused, unfused, atol=1e-6)
    # Restarting per segment: the second segment's first token is rotated as position 0 (unchanged by RoPE).
    assert torch.allclose(fused[3], t[3], atol=1e-6) and not torch.allclose(fused[4], t[4], atol=1e-3)
    with pytest.raises(AssertionError, match="cu_seqlens must not be None"):
        apply_rotary_pos_emb(t, freqs, tensor_format="thd", fused=True)
    with pytest.raises(AssertionError, match="1-D int32"):
        apply_rotary_pos_emb(t, freqs, tensor_format="thd", fused=True, cu_seqlens=layout.cu_seqlens.long())
