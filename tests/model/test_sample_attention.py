"""Per-sample attention for random-length samples laid end to end: through the training step's `forward_backward`,
each sample's logits and loss are those of the sample alone, for CLM and MLM (megatron's local layers, the
block-diagonal mask of `mlmclm.model.document_attention`, one CPU process)."""
import torch

from mlmclm.model import ModelConfig, build_model, set_causal
from mlmclm.model.document_attention import PADDING_PIECE_TOKENS, DocumentLayout, attention_layout
from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel
from mlmclm.parallel.launch import spawn

SHAPE = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                    vocab_size=200, max_position_embeddings=64, rope_theta=500.0, make_vocab_divisible_by=64)
LENGTHS = [7, 13, 5, 9]
PAD = 14  # up to 48 tokens, a multiple of 16, as the loader pads
FIRST_SAMPLE = 100


def micro_batch() -> dict:
    """What `RandomLengthLoader` gives: the samples laid end to end in one padded row (a document starts inside
    the second sample; with per-sample attention only, it is attended across)."""
    gen = torch.Generator().manual_seed(1)
    tokens = torch.cat([torch.randint(4, SHAPE.vocab_size, (sum(LENGTHS),), generator=gen), torch.full((PAD,), 2)])
    ids = torch.cat([torch.full((n,), FIRST_SAMPLE + k) for k, n in enumerate(LENGTHS)] + [torch.full((PAD,), -1)])
    positions = torch.cat([torch.arange(n) for n in LENGTHS] + [torch.arange(PAD)])
    documents = torch.zeros_like(tokens)
    documents[LENGTHS[0] + 4:] = 1
    documents[sum(LENGTHS):] = 2
    return {"tokens": tokens[None], "sample_ids": ids[None], "positions": positions[None],
            "document_ids": documents[None]}


def _run(out_path):
    from mlmclm.objectives import ObjectiveConfig, build_objective
    from mlmclm.train.optim import OptimizerConfig, build_optimizer, wrap_ddp
    from mlmclm.train.step import configure_model_for_schedules, forward_backward

    init_parallel(ParallelConfig(), seed=3)
    torch.manual_seed(0)
    chunks = build_model(SHAPE, ParallelConfig(), causal=False)
    ddp = wrap_ddp(chunks, distributed_optimizer=False)
    configure_model_for_schedules(ddp, build_optimizer(ddp, OptimizerConfig(lr=1e-3)))
    captured = []
    chunks[0].output_layer.register_forward_hook(
        lambda module, inputs, output: captured.append((output[0] if isinstance(output, tuple) else output)
                                                       .detach().clone()))
    mb = micro_batch()
    layout = attention_layout(mb, per_document=False)

    def run(batch, documents, sparse):
        captured.clear()
        with torch.no_grad():
            stats = forward_backward(ddp, [batch], forward_only=True, sparse_head=sparse, documents=documents)
        return captured[0][:, 0], stats[:2].tolist()   # logits [s, v] of the one micro-batch, (loss sum, count)

    out = {"segments": layout.cu_seqlens.tolist()}
    for kind in ("clm", "mlm"):
        objective = build_objective(ObjectiveConfig(kind, mask_ratio=0.4), special_token_ids=[0, 1, 2, 3],
                                    mask_token_id=3, vocab_size=SHAPE.vocab_size, seed=5, pad_token_id=2)
        set_causal(chunks, objective.causal)
        batch = objective.prepare(mb["tokens"], mb["sample_ids"], mb["positions"])
        packed, packed_stats = run(batch, [layout], sparse=False)
        across, _ = run(batch, None, sparse=False)
        _, sparse_stats = run(batch, [layout], sparse=True)
        alone_logits, alone_loss, alone_count, start = [], 0.0, 0, 0
        for k, n in enumerate(LENGTHS):
            alone = objective.prepare(mb["tokens"][:, start:start + n], torch.tensor([FIRST_SAMPLE + k]))
            logits, (loss, count) = run(alone, None, sparse=False)
            alone_logits.append(logits)
            alone_loss, alone_count, start = alone_loss + loss, alone_count + count, start + n
        alone_logits = torch.cat(alone_logits)
        out[kind] = {"packed_gap": float((packed[:start] - alone_logits).abs().max()),
                     "across_gap": float((across[:start] - alone_logits).abs().max()),
                     "packed": packed_stats, "sparse": sparse_stats, "alone": [alone_loss, alone_count]}
    torch.save(out, out_path)
    destroy_parallel()


def test_each_sample_through_forward_backward_equals_the_sample_alone(tmp_path):
    spawn(_run, 1, tmp_path / "out.pt")
    r = torch.load(tmp_path / "out.pt")
    # One segment per sample (the document start inside one is not a cut), then the padding in pieces no longer
    # than the longest sample (13 tokens): 14 = 13 + 1.
    bounds = [0, *torch.tensor(LENGTHS).cumsum(0).tolist(), sum(LENGTHS) + 13, sum(LENGTHS) + PAD]
    assert r["segments"] == bounds
    for kind in ("clm", "mlm"):
        result = r[kind]
        assert result["packed_gap"] <= 1e-5, (kind, result)
        assert result["across_gap"] > 1e-3, (kind, result)   # without the layout the samples see each other
        loss, count = result["alone"]
        assert count > 0 and result["packed"][1] == result["sparse"][1] == count, (kind, result)
        assert abs(result["packed"][0] - loss) <= 1e-5 * loss and abs(result["sparse"][0] - loss) <= 1e-5 * loss


LONG_PAD = 150  # a micro-batch padded to a longer neighbour's length (pipeline parallelism's same_length)


def padded_micro_batch(pad: int = LONG_PAD) -> dict:
    mb = micro_batch()
    real = sum(LENGTHS)
    extra = pad - PAD
    return {"tokens": torch.cat([mb["tokens"], torch.full((1, extra), 2)], dim=1),
            "sample_ids": torch.cat([mb["sample_ids"], torch.full((1, extra), -1)], dim=1),
            "positions": torch.cat([mb["positions"][:, :real], torch.arange(pad)[None]], dim=1),
            "document_ids": torch.cat([mb["document_ids"], torch.full((1, extra), 2)], dim=1)}


def test_padding_is_cut_into_pieces_no_longer_than_the_longest_sample():
    layout = attention_layout(padded_micro_batch(), per_document=False)
    real = sum(LENGTHS)
    bounds = layout.cu_seqlens.tolist()
    assert bounds[:len(LENGTHS) + 1] == [0, *torch.tensor(LENGTHS).cumsum(0).tolist()]
    pieces = torch.tensor(bounds[len(LENGTHS):]).diff()
    assert pieces.sum() == LONG_PAD and pieces.max() == max(LENGTHS) and layout.max_seqlen == max(LENGTHS)
    # With a long sample the pieces stop at PADDING_PIECE_TOKENS; the samples' own segments are untouched.
    ids = torch.cat([torch.zeros(300, dtype=torch.long), torch.full((500,), -1)])[None]
    long = attention_layout({"sample_ids": ids, "document_ids": torch.zeros_like(ids)}, per_document=True)
    assert long.cu_seqlens.tolist() == [0, 300, 300 + PADDING_PIECE_TOKENS, 300 + 2 * PADDING_PIECE_TOKENS,
                                        300 + 3 * PADDING_PIECE_TOKENS, 800] and long.max_seqlen == 300
    assert real + PAD < real + LONG_PAD


def _one_padding_segment(mb) -> DocumentLayout:
    """The layout as it was: the samples, then all the padding as one segment."""
    ids = mb["sample_ids"].clone()
    ids[ids < 0] = ids.max() + 1
    starts = torch.zeros_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    return DocumentLayout.from_document_ids(starts.cumsum(dim=1))


def _run_padding(out_path):
    from mlmclm.objectives import ObjectiveConfig, build_objective
    from mlmclm.train.optim import OptimizerConfig, build_optimizer, wrap_ddp
    from mlmclm.train.step import configure_model_for_schedules, forward_backward

    init_parallel(ParallelConfig(), seed=3)
    torch.manual_seed(0)
    chunks = build_model(SHAPE, ParallelConfig(), causal=False, packed_segments=True)
    ddp = wrap_ddp(chunks, distributed_optimizer=False)
    configure_model_for_schedules(ddp, build_optimizer(ddp, OptimizerConfig(lr=1e-3)))
    mb = padded_micro_batch()
    out = {}
    for kind in ("clm", "mlm"):
        objective = build_objective(ObjectiveConfig(kind, mask_ratio=0.4), special_token_ids=[0, 1, 2, 3],
                                    mask_token_id=3, vocab_size=SHAPE.vocab_size, seed=5, pad_token_id=2)
        set_causal(chunks, objective.causal)
        batch = objective.prepare(mb["tokens"], mb["sample_ids"], mb["positions"])
        for name, layout in (("pieces", attention_layout(mb, per_document=False)), ("one", _one_padding_segment(mb))):
            for head in (256, 0):  # the chunked head (the training default) and megatron's
                ddp[0].zero_grad_buffer()
                stats = forward_backward(ddp, [batch], documents=[layout], head_chunk_tokens=head)
                grads = torch.cat([p.main_grad.reshape(-1).clone() for p in chunks[0].parameters()])
                out[(kind, head, name)] = (stats.clone(), grads, layout.max_seqlen)
    torch.save(out, out_path)
    destroy_parallel()


def test_losses_and_gradients_do_not_depend_on_how_the_padding_is_cut(tmp_path):
    """Bit for bit on CPU: padding predicts nothing and no real token attends to it."""
    spawn(_run_padding, 1, tmp_path / "out.pt")
    r = torch.load(tmp_path / "out.pt")
    for kind in ("clm", "mlm"):
        for head in (256, 0):
            pieces, one = r[(kind, head, "pieces")], r[(kind, head, "one")]
            assert torch.equal(pieces[0], one[0]) and pieces[0][1] > 0, (kind, head)
            assert torch.equal(pieces[1], one[1]) and pieces[1].abs().sum() > 0, (kind, head)
            assert pieces[2] == max(LENGTHS) and one[2] == LONG_PAD, (kind, head)
