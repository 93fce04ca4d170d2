"""ModernBERT on megatron's Transformer Engine layer spec, through megatron's own TE extension over the TE stand-in
of tests/stand_ins/te (CPU; the real TE is unverified here, see docs/training.md): the same weights give the local
spec's logits — bidirectional and causal (TE's window per layer: (w, w), then (w, 0) after `set_causal`), and on
packed documents shorter than the window (THD segments on TE, the block-diagonal mask on local layers) — so the TE
spec builds ModernBERT's layers as the local one does: windows on the local layers only, their own RoPE θ, the
embedding norm in layer 0, the head and the decoder bias."""
import torch

from mlmclm.parallel.launch import spawn
from tests.model.modernbert_fixtures import SEQ, random_modernbert

DOCUMENTS = [3, 5, 11, 13]


def _worker(out: str) -> None:
    from tests.stand_ins import transformer_engine_stand_in

    transformer_engine_stand_in.install()  # before megatron is imported in this rank
    from mlmclm.convert.modernbert_config import model_config_from_modernbert
    from mlmclm.model import build, build_model, fusions, set_causal
    from mlmclm.model.architectures import mapping_table
    from mlmclm.model.document_attention import DocumentLayout, block_diagonal_mask, packed_seq_params
    from mlmclm.model.hf_mapping import hf_to_megatron
    from mlmclm.model.weights import load_full_weights
    from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel

    build.transformer_engine_available = lambda: (True, "the TE stand-in (tests/stand_ins/te) on CPU")
    fusions.probe_kernels = lambda: fusions.KernelAvailability(
        gpu=None, apex_softmax="no CUDA", apex_wgrad="no CUDA", jit_fuser="no CUDA", te_rope=fusions._te_rope_error())
    init_parallel(ParallelConfig(), seed=0)
    try:
        hf = random_modernbert()
        model = model_config_from_modernbert(hf.config, "tiny", make_vocab_divisible_by=64).model
        weights = dict(hf_to_megatron(hf.state_dict().__getitem__, model, model.padded_vocab_size(1),
                                      mapping_table(model)))
        tokens = torch.randint(4, model.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(1))
        positions = torch.arange(SEQ).expand(2, SEQ)
        ids = torch.repeat_interleave(torch.arange(len(DOCUMENTS)), torch.tensor(DOCUMENTS)).expand(2, SEQ)
        layout = DocumentLayout.from_document_ids(ids)
        r = {}
        for spec in ("local", "te"):
            for packed in (False, True):
                chunks = build_model(model, ParallelConfig(), causal=False, use_te=spec == "te",
                                     packed_segments=packed, max_row_tokens=SEQ, rows=2)
                load_full_weights(chunks, weights.__getitem__)
                gpt = chunks[0].eval()
                if spec == "te":
                    r["classes"] = {type(m).__name__ for m in gpt.modules()}
                for causal in (False, True):
                    set_causal(chunks, causal)
                    with torch.no_grad():
                        if not packed:
                            logits = gpt(tokens, positions, None)
                        elif spec == "local":
                            logits = gpt(tokens, positions, block_diagonal_mask(ids, causal))
                        else:  # THD: the rows end to end, one segment per document
                            logits = gpt(tokens.reshape(1, -1), positions.reshape(1, -1), None,
                                         packed_seq_params=packed_seq_params(layout)).reshape(2, SEQ, -1)
                    r[(spec, packed, causal)] = logits[..., :model.vocab_size]
        torch.save(r, out)
    finally:
        destroy_parallel()


def test_te_spec_computes_modernbert_as_the_local_spec(tmp_path):
    spawn(_worker, 1, str(tmp_path / "r.pt"))
    r = torch.load(tmp_path / "r.pt", weights_only=False)
    assert {"TEColumnParallelLinear", "TERowParallelLinear", "TEDotProductAttention"} <= r["classes"]
    for packed in (False, True):
        for causal in (False, True):
            te, local = r[("te", packed, causal)], r[("local", packed, causal)]
            assert (te - local).abs().max() <= 1e-5, (packed, causal, (te - local).abs().max())
    assert (r[("te", False, True)] - r[("te", False, False)]).abs().max() > 1e-3
    assert (r[("te", True, False)] - r[("te", False, False)]).abs().max() > 1e-3
