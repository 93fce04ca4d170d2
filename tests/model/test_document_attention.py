"""Per-document attention: each packed document is computed as if it were alone (local layers, explicit mask)."""
import torch
import torch.nn.functional as F

from mlmclm.model import ModelConfig, build_model, set_causal
from mlmclm.model.document_attention import DocumentLayout, block_diagonal_mask, packed_seq_params
from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel
from mlmclm.parallel.launch import spawn

SHAPE = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                    vocab_size=200, max_position_embeddings=64, rope_theta=500.0, make_vocab_divisible_by=64)
SEQ = 24
DOC_LENGTHS = [[5, 11, 8], [7, 17]]  # two packed rows


def document_ids() -> torch.Tensor:
    return torch.stack([torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
                        for lengths in DOC_LENGTHS])


def segments():
    for row, lengths in enumerate(DOC_LENGTHS):
        start = 0
        for length in lengths:
            yield row, start, start + length
            start += length


def test_layout_marks_every_document_and_row_start():
    layout = DocumentLayout.from_document_ids(torch.tensor([[0, 0, 1, 1, 1, 2], [0, 0, 0, 1, 1, 1]]))
    assert layout.cu_seqlens.tolist() == [0, 2, 5, 6, 9, 12]
    assert layout.cu_seqlens.dtype == torch.int32 and layout.max_seqlen == 3
    # A row continuing the previous row's document (id 0 in both) still starts its own segment.
    cont = DocumentLayout.from_document_ids(torch.tensor([[0, 0, 0], [0, 0, 1]]))
    assert cont.cu_seqlens.tolist() == [0, 3, 5, 6]
    params = packed_seq_params(layout)
    assert params.qkv_format == "thd" and params.max_seqlen_q == params.max_seqlen_kv == 3
    assert params.cu_seqlens_q is layout.cu_seqlens


def test_thd_inputs_reindex_the_sparse_heads_positions():
    """TE layers get the rows end to end ([1, b·S]); the sparse head's positions, found on the host for the batch
    as made ([b, S], sequence-major), must then still pick the same tokens: same labels, same order."""
    from mlmclm.model.sparse_head import flat_positions, select_labels
    from mlmclm.objectives import ObjectiveBatch
    from mlmclm.train.step import document_attention_inputs

    gen = torch.Generator().manual_seed(0)
    labels = torch.randint(4, 200, (len(DOC_LENGTHS), SEQ), generator=gen)
    mask = (torch.rand(len(DOC_LENGTHS), SEQ, generator=gen) < 0.4).float()
    batch = ObjectiveBatch(input_ids=labels.clone(), labels=labels, loss_mask=mask, causal=False,
                           num_predicted=mask.sum().long())
    positions = flat_positions([mask])[0]
    layout = DocumentLayout.from_document_ids(document_ids())
    flat, kwargs, moved = document_attention_inputs(batch, layout, thd=True, positions=positions)
    assert flat.input_ids.shape == (1, len(DOC_LENGTHS) * SEQ) and "packed_seq_params" in kwargs
    assert torch.equal(select_labels(flat.labels, moved), select_labels(batch.labels, positions))
    assert sorted(moved.tolist()) == flat_positions([flat.loss_mask])[0].tolist()
    # Local layers keep the batch (and so the positions) as made.
    same, kwargs, kept = document_attention_inputs(batch, layout, thd=False, positions=positions)
    assert same is batch and kept is positions and "attention_mask" in kwargs


def test_block_diagonal_mask_blocks_other_documents_and_for_clm_the_future():
    ids = torch.tensor([[0, 0, 1, 1]])
    allowed = ~block_diagonal_mask(ids, causal=False)[0, 0]
    assert allowed.tolist() == [[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 1, 1], [0, 0, 1, 1]]
    allowed = ~block_diagonal_mask(ids, causal=True)[0, 0]
    assert allowed.tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]


def _run(out_path):
    from mlmclm.objectives import ObjectiveConfig, build_objective
    from mlmclm.train.optim import OptimizerConfig, build_optimizer, wrap_ddp
    from mlmclm.train.step import configure_model_for_schedules, forward_backward

    init_parallel(ParallelConfig(), seed=3)
    torch.manual_seed(0)
    chunks = build_model(SHAPE, ParallelConfig(), causal=False)
    model = chunks[0].eval()
    tokens = torch.randint(4, SHAPE.vocab_size, (len(DOC_LENGTHS), SEQ))
    positions = torch.arange(SEQ).expand(len(DOC_LENGTHS), SEQ)
    layout = DocumentLayout.from_document_ids(document_ids())
    out = {}
    with torch.no_grad():
        for causal in (False, True):
            set_causal(chunks, causal)
            mask = block_diagonal_mask(layout.document_ids, causal)
            packed = model(tokens, positions, mask)
            across = model(tokens, positions, None)
            alone = torch.zeros_like(packed)
            for row, a, b in segments():
                alone[row, a:b] = model(tokens[row:row + 1, a:b], torch.arange(b - a).unsqueeze(0), None)[0]
            out[causal] = dict(packed=packed, across=across, alone=alone)

    # The training step's path: forward_backward with the layouts gives the loss of each document alone.
    # (References first: once wired for the schedules, the output layer's accuracy tap expects their batches.)
    batches = {}
    for kind in ("mlm", "clm"):
        objective = build_objective(ObjectiveConfig(kind, mask_ratio=0.4), special_token_ids=[0, 1, 2, 3],
                                    mask_token_id=3, vocab_size=SHAPE.vocab_size, seed=5)
        batch = batches[kind] = objective.prepare(tokens, torch.arange(len(DOC_LENGTHS)))
        set_causal(chunks, objective.causal)
        reference = torch.zeros((), dtype=torch.float64)
        with torch.no_grad():
            for row, a, b in segments():
                logits = model(batch.input_ids[row:row + 1, a:b], torch.arange(b - a).unsqueeze(0), None)[0]
                labels, keep = batch.labels[row, a:b], batch.loss_mask[row, a:b] > 0
                reference += F.cross_entropy(logits[keep].float(), labels[keep], reduction="sum").double()
        out[kind] = dict(reference=float(reference), expected_count=int(batch.loss_mask.sum()))
    ddp = wrap_ddp(chunks, distributed_optimizer=False)
    optimizer = build_optimizer(ddp, OptimizerConfig(lr=1e-3))
    configure_model_for_schedules(ddp, optimizer)
    for kind, batch in batches.items():
        set_causal(chunks, batch.causal)
        with torch.no_grad():
            stats = forward_backward(ddp, [batch], forward_only=True, documents=[layout])
        out[kind].update(loss_sum=float(stats[0]), count=int(stats[1]))
    out["softmax"] = _softmax_with_apex_kernels(layout)
    torch.save(out, out_path)
    destroy_parallel()


def _softmax_with_apex_kernels(layout):
    """megatron's own `FusedScaleMaskSoftmax` selection in the model we build on a GPU without TE (bf16, apex's
    softmax kernels present: `masked_softmax_fusion` on), the kernels a stand-in (tests/stand_ins/apex_softmax.py):
    per phase, the largest attention weight on a masked (other-sample or future) key, and which kernels ran."""
    import dataclasses

    from tests.stand_ins import apex_softmax

    from mlmclm.model import fusions
    from mlmclm.model.precision import PrecisionConfig

    gpu_without_te = fusions.KernelAvailability(gpu=None, apex_softmax=None, apex_wgrad="absent here",
                                                jit_fuser="absent here", te_rope="no TE")
    probe, fusions.probe_kernels = fusions.probe_kernels, lambda: gpu_without_te
    try:
        chunks = build_model(SHAPE, ParallelConfig(), PrecisionConfig(dtype="bf16"), causal=True, use_te=False,
                             packed_segments=True)
    finally:
        fusions.probe_kernels = probe
    softmaxes = [m for m in chunks[0].modules() if type(m).__name__ == "FusedScaleMaskSoftmax"]
    result = {"fusion_on": all(m.scaled_masked_softmax_fusion and m.input_in_bf16 for m in softmaxes)}
    heads = SHAPE.num_attention_heads
    scores = torch.randn(len(DOC_LENGTHS), heads, SEQ, SEQ, generator=torch.Generator().manual_seed(1))
    with apex_softmax.installed() as calls:
        for causal in (True, False):
            set_causal(chunks, causal)
            mask = block_diagonal_mask(layout.document_ids, causal)
            leak = max(float(m(scores.bfloat16(), mask)[mask.expand_as(scores)].float().abs().max())
                       for m in softmaxes)
            result[causal] = {"leak": leak, "calls": dict(calls)}
            calls.clear()
        set_causal(chunks, True)
        try:
            softmaxes[0](scores.bfloat16(), None)
            result["without_mask"] = "ran"
        except RuntimeError as err:
            result["without_mask"] = str(err)
    return result


def test_packed_documents_equal_each_document_alone(tmp_path):
    out = tmp_path / "out.pt"
    spawn(_run, 1, out)
    r = torch.load(out)
    for causal in (False, True):
        packed, across, alone = r[causal]["packed"], r[causal]["across"], r[causal]["alone"]
        assert (packed - alone).abs().max() <= 1e-5, causal
        # Without the mask the documents see each other: the comparison above is not vacuous.
        assert (across - alone).abs().max() > 1e-3, causal
    for kind in ("mlm", "clm"):
        assert r[kind]["count"] == r[kind]["expected_count"] > 0
        assert abs(r[kind]["loss_sum"] - r[kind]["reference"]) <= 1e-5 * r[kind]["reference"], (kind, r[kind])
    softmax = r["softmax"]
    # On a GPU without TE (apex kernels, bf16) megatron's softmax takes a fused kernel for these shapes — and must
    # take one that applies our mask: no weight on another sample's keys (nor, in CLM, on the future).
    assert softmax["fusion_on"]
    for causal in (True, False):
        assert softmax[causal]["calls"] == {"masked": SHAPE.num_layers}, softmax[causal]
        assert softmax[causal]["leak"] == 0.0, (causal, softmax[causal])
    assert "called without one" in softmax["without_mask"]


def test_local_layers_refuse_packed_rows_too_long_for_a_mask():
    """The fallback from TE to local layers at the paper's scale: a 24,576 × 24,576 mask and fp32 scores per layer
    (~29 GB at 12 heads) is refused with the cause, not left to run out of memory."""
    import pytest

    from mlmclm.model.document_attention import check_local_packed_attention

    class Chunk:
        def __init__(self, mask):
            self.mask_carries_causality = mask

    with pytest.raises(ValueError, match=r"24576 x 24576 mask and 29\.0 GB.*transformer-engine"):
        check_local_packed_attention([Chunk(True)], 24576, heads_per_rank=12)
    check_local_packed_attention([Chunk(True)], 4096, heads_per_rank=12)  # within apex's fused softmax
    check_local_packed_attention([Chunk(False)], 24576, heads_per_rank=12)  # TE layers: THD, no mask
