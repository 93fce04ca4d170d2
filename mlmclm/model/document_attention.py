"""Per-document attention inside packed rows: each token attends only to tokens of its own document.

A prepared row packs several documents back to back (`mlmclm.data.prepare`); by default attention crosses their
boundaries, as in the paper's trainer (the authors' Optimus packs documents into fixed-size blocks and attends over
the whole block). With `per_document_attention` each document is seen as if it were alone:

- megatron's local layers (CPU, or GPU without TE): an explicit block-diagonal mask [b, 1, S, S] (causal within
  each document for CLM), passed as the model's `attention_mask`; megatron fills masked scores with -10000 before
  an fp32 softmax, so masked keys get exactly zero weight;
- Transformer Engine layers: the THD packed format. The micro-batch's rows are laid end to end as one sequence of
  b·S tokens, `PackedSeqParams.cu_seqlens` mark every document start and every row start, and TE's fused
  attention (cuDNN) attends within each segment; RoPE restarts at each segment there.

RoPE positions differ between the two (the mask keeps each token's position in the row, THD restarts at 0), but
rotary attention depends only on the distance between query and key, so both equal running each document alone
up to rounding. The local path is tested against that on CPU; the THD path needs TE and a GPU (see
`benchmarks/gpu_train_check.py`), and is unverified where that has not run.

Random-length samples (`mlmclm.data.random_length`, the paper's) use the same mechanism with samples as segments:
a micro-batch is one row of samples laid end to end, and `attention_layout` cuts it at every sample start (and,
with per-document attention, at every document start as well). Padding is cut into short segments of its own
(`PADDING_PIECE_TOKENS`, never longer than the longest real segment): one segment of it would cost attention its
length squared — with pipeline parallelism every micro-batch is padded to the step's longest, as long as the real
samples — and raise `max_seqlen`, which sizes TE's kernels. Padding predicts nothing and nothing attends to it, so
the losses do not depend on how it is cut.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from mlmclm.parallel.runtime import to_device


@dataclass
class DocumentLayout:
    """Where documents start in one micro-batch, prepared on the host before the batch moves to the device."""

    document_ids: torch.Tensor  # [b, S] int64: per row, 0 for the document the row starts in, +1 at each start
    cu_seqlens: torch.Tensor    # [segments + 1] int32: boundaries of the segments in the rows laid end to end
    max_seqlen: int             # longest segment (a host int: TE needs it without a device synchronisation)

    @classmethod
    def from_document_ids(cls, document_ids: torch.Tensor) -> "DocumentLayout":
        """From the loader's [b, S] document ids (on the host)."""
        if document_ids.dim() != 2:
            raise ValueError(f"document ids must be [b, S], got shape {tuple(document_ids.shape)}")
        rows, seq = document_ids.shape
        flat = document_ids.reshape(-1)
        starts = torch.ones_like(flat, dtype=torch.bool)
        starts[1:] = flat[1:] != flat[:-1]
        starts[::seq] = True  # each row starts a segment, whatever its first document id
        bounds = torch.cat([starts.nonzero().reshape(-1), torch.tensor([rows * seq])])
        lengths = bounds[1:] - bounds[:-1]
        return cls(document_ids.to(torch.int64), bounds.to(torch.int32), int(lengths.max()))

    def to(self, device) -> "DocumentLayout":
        return DocumentLayout(to_device(self.document_ids, device), to_device(self.cu_seqlens, device),
                              self.max_seqlen)


# Padding pieces: short enough that attention over padding costs little (128 tokens: about one kernel tile), never
# longer than the micro-batch's longest real segment (so `max_seqlen` is a real sample's).
PADDING_PIECE_TOKENS = 128


def attention_layout(micro_batch: dict, per_document: bool) -> DocumentLayout:
    """The layout of a loader's micro-batch: segments are its documents, or, for random-length samples (which
    carry per-token `sample_ids` [b, S], -1 on padding), its samples — cut at document starts too when
    `per_document` — and the padding in pieces (`padding_piece_starts`)."""
    documents = micro_batch["document_ids"]
    samples = micro_batch["sample_ids"]
    if samples.dim() != 2:
        return DocumentLayout.from_document_ids(documents)
    starts = torch.zeros_like(samples, dtype=torch.bool)
    starts[:, 1:] = samples[:, 1:] != samples[:, :-1]
    if per_document:
        starts[:, 1:] |= documents[:, 1:] != documents[:, :-1]
    starts |= padding_piece_starts(starts, samples < 0)
    return DocumentLayout.from_document_ids(starts.cumsum(dim=1))


def padding_piece_starts(starts: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """[b, S] bool: where padding pieces begin — every `piece` tokens of each run of padding, `piece` =
    min(PADDING_PIECE_TOKENS, the longest segment of real tokens). `starts` marks the segment starts so far (a row
    start need not be marked), `padding` the padding tokens."""
    if not bool(padding.any()):
        return torch.zeros_like(padding)
    rows, seq = starts.shape
    cuts = starts.clone()
    cuts[:, 0] = True
    segment = cuts.reshape(-1).cumsum(0)  # segment index of every token, rows end to end
    real = ~padding.reshape(-1)
    longest = int(torch.bincount(segment[real]).max()) if bool(real.any()) else PADDING_PIECE_TOKENS
    piece = max(1, min(PADDING_PIECE_TOKENS, longest))
    run_begins = padding.clone()
    run_begins[:, 1:] &= ~padding[:, :-1]
    index = torch.arange(seq).expand(rows, seq)
    run_start = torch.where(run_begins, index, torch.zeros_like(index)).cummax(dim=1).values
    return padding & ((index - run_start) % piece == 0)


def block_diagonal_mask(document_ids: torch.Tensor, causal: bool) -> torch.Tensor:
    """[b, 1, S, S] bool, True where attention is *not* allowed (megatron's convention): across documents, and
    for `causal` also to later positions."""
    same = document_ids.unsqueeze(2) == document_ids.unsqueeze(1)  # [b, S(query), S(key)]
    if causal:
        seq = document_ids.shape[1]
        same &= torch.ones(seq, seq, dtype=torch.bool, device=document_ids.device).tril()
    return ~same.unsqueeze(1)


def packed_seq_params(layout: DocumentLayout):
    """megatron's `PackedSeqParams` for the THD format over the micro-batch's rows laid end to end."""
    from megatron.core.packed_seq_params import PackedSeqParams

    return PackedSeqParams(qkv_format="thd", cu_seqlens_q=layout.cu_seqlens, cu_seqlens_kv=layout.cu_seqlens,
                           max_seqlen_q=layout.max_seqlen, max_seqlen_kv=layout.max_seqlen)


def rows_end_to_end(tensor: torch.Tensor) -> torch.Tensor:
    """[b, S] → [1, b·S]: the THD layout's single sequence (megatron's [b, s] with b = 1)."""
    return tensor.reshape(1, -1)


def positions_end_to_end(positions: torch.Tensor, batch_size: int, seq_length: int) -> torch.Tensor:
    """Flat indices into the sequence-major [S·b] grid of a [b, S] batch (the sparse head's positions) → the same
    tokens' indices once `rows_end_to_end` has made the batch one sequence: row r, column c moves from c·b + r
    to r·S + c. Computed where the positions are (no read from the device)."""
    return (positions % batch_size) * seq_length + positions // batch_size


# Local layers attend to packed segments through an explicit [b, 1, T, T] mask, and megatron's local attention
# materialises [b, heads, T, T] scores and probabilities per layer (fp32 for the softmax). Above 4096 keys apex's
# fused softmax does not apply (megatron: 16 < sk <= 4096) and those tensors outgrow a GPU: at the paper's worst
# micro-batch (12 samples of 2048, T = 24,576) with 12 heads they are 12 × T² × 4 B ≈ 29 GB per layer. Only TE's
# THD attention runs such rows.
LOCAL_MASK_MAX_TOKENS = 4096


def local_attention_bytes(row_tokens: int, heads_per_rank: int, rows: int = 1) -> int:
    """The fp32 [rows, heads, T, T] attention scores of one local layer (what the explicit mask costs)."""
    return rows * heads_per_rank * row_tokens * row_tokens * 4


def check_local_packed_attention(chunks, row_tokens: int, heads_per_rank: int, rows: int = 1) -> None:
    """Refuse local (non-TE) layers on packed segments whose rows are too long for a T × T mask per layer."""
    if not any(getattr(chunk, "mask_carries_causality", False) for chunk in chunks):
        return
    if row_tokens > LOCAL_MASK_MAX_TOKENS:
        size = local_attention_bytes(row_tokens, heads_per_rank, rows) / 1e9
        raise ValueError(
            f"packed segments of up to {row_tokens} tokens per row on megatron's local layers (Transformer Engine "
            f"is not in use): attention would need a {row_tokens} x {row_tokens} mask and {size:.1f} GB of fp32 "
            f"scores per layer (more than {LOCAL_MASK_MAX_TOKENS} tokens per row is refused). Install "
            f"transformer-engine[pytorch]>=2.2 (THD attention, no mask) or use shorter micro-batches")
