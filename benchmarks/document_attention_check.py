"""Per-document attention on the device equals each document alone (logits, bf16 tolerance), CLM and MLM: the local
layers' block-diagonal mask, and with TE the THD packed format (not testable on CPU). A check of
benchmarks/gpu_train_check.py, in its own spawned rank."""
from __future__ import annotations

import json
from pathlib import Path

DOC_LENGTHS = [[40, 100, 60, 56], [256], [10, 246]]  # three packed rows of 256 tokens


def _document_attention_worker(use_te: bool, out_path: str) -> None:
    import torch

    from mlmclm.model import build_model, preset, set_causal
    from mlmclm.model.document_attention import DocumentLayout, block_diagonal_mask, packed_seq_params
    from mlmclm.model.precision import PrecisionConfig
    from mlmclm.parallel import ParallelConfig, current_device, destroy_parallel, init_parallel

    init_parallel(ParallelConfig(), seed=3)
    torch.manual_seed(0)
    shape = preset("tiny")
    # packed_segments: the local softmax then takes the causality from the mask (apex's causal kernel would drop
    # it), so every local call below passes one — a single segment for the references.
    chunks = build_model(shape, ParallelConfig(), PrecisionConfig(dtype="bf16"), causal=False, use_te=use_te,
                         packed_segments=True)
    model, device = chunks[0].eval(), current_device()
    seq = sum(DOC_LENGTHS[0])
    ids = torch.stack([torch.repeat_interleave(torch.arange(len(n)), torch.tensor(n)) for n in DOC_LENGTHS])
    layout = DocumentLayout.from_document_ids(ids)
    tokens = torch.randint(5, shape.vocab_size, ids.shape, device=device)
    positions = torch.arange(seq, device=device).expand_as(tokens)
    result = {}
    with torch.no_grad():
        for causal in (False, True):
            set_causal(chunks, causal)
            if use_te:  # THD: rows end to end, one sequence
                flat = model(tokens.reshape(1, -1), torch.arange(tokens.numel(), device=device).unsqueeze(0), None,
                             packed_seq_params=packed_seq_params(layout.to(device)))
                packed = flat.reshape(tokens.shape[0], seq, -1)
            else:
                packed = model(tokens, positions, block_diagonal_mask(layout.document_ids.to(device), causal))
            def one_segment(rows, length):
                return None if use_te else block_diagonal_mask(torch.zeros(rows, length, dtype=torch.long,
                                                                           device=device), causal)

            across = model(tokens, positions, one_segment(*tokens.shape))
            worst, spread = 0.0, 0.0
            for row, lengths in enumerate(DOC_LENGTHS):
                start = 0
                for n in lengths:
                    alone = model(tokens[row:row + 1, start:start + n],
                                  torch.arange(n, device=device).unsqueeze(0), one_segment(1, n))[0].float()
                    worst = max(worst, float((packed[row, start:start + n].float() - alone).abs().max()))
                    spread = max(spread, float((across[row, start:start + n].float() - alone).abs().max()))
                    start += n
            result["causal" if causal else "bidirectional"] = {"max_abs_diff_vs_alone": worst,
                                                              "max_abs_diff_without_mask": spread}
    Path(out_path).write_text(json.dumps(result))
    destroy_parallel()


def document_attention_check(checks, out: Path, use_te: bool) -> None:
    from mlmclm.parallel.launch import spawn

    name = f"per-document attention = each document alone ({'TE, THD' if use_te else 'local layers, mask'})"
    path = out / f"doc_attention_{'te' if use_te else 'local'}.json"
    try:
        spawn(_document_attention_worker, 1, use_te, str(path))
        result = json.loads(path.read_text())
        # bf16 logits of an untrained model are O(1): rounding differences stay far below the cross-document effect.
        ok = all(r["max_abs_diff_vs_alone"] <= 0.05 and r["max_abs_diff_without_mask"] > 4 * r["max_abs_diff_vs_alone"]
                 for r in result.values())
        checks.record(name, ok, **result)
    except Exception as err:
        checks.record(name, False, error=f"{type(err).__name__}: {err}")
