"""`per_document_attention: true` reaches every training step with the loader's document boundaries; the same
spawned run also checks that `deterministic: true` is in force during training (one spawn for both: each costs
~10 s of start-up)."""
import json

import torch

import train_scenarios as sc
from mlmclm.data.prepare import PrepareConfig, prepare
from mlmclm.parallel.launch import spawn


def short_documents(tmp_path):
    """Documents of a few dozen tokens, so that rows of 64 pack several of them."""
    source = tmp_path / "docs.jsonl"
    lines = [json.dumps({"text": f"Document {i}: " + " ".join(["to be or not to be"] * (1 + i % 5))})
             for i in range(200)]
    source.write_text("\n".join(lines) + "\n")
    out = tmp_path / "data"
    prepare(PrepareConfig(inputs=[str(source)], output_dir=str(out), tokenizer="embedded", seq_length=sc.SEQ,
                          workers=1, progress=False))
    return out


def test_every_step_gets_the_loaders_document_layout(tmp_path):
    cfg = sc.config(tmp_path / "run", short_documents(tmp_path), tp=1, total_steps=3, per_document_attention=True,
                    deterministic=True,
                    phases=[{"objective": {"kind": "clm"}, "steps": 1},
                            {"objective": {"kind": "mlm", "mask_ratio": 0.3}, "steps": 2}],
                    checkpoint={"save_interval": None}, schedule={"style": "constant"})
    spawn(sc.run_recording_documents, 1, cfg, tmp_path / "records.pt")
    records = torch.load(tmp_path / "records.pt")
    assert len(records["seen"]) == len(records["loader"]) == 3  # one per step, CLM and MLM alike
    boundaries = 0
    for layouts, loader_ids in zip(records["seen"], records["loader"]):
        assert layouts is not None and len(layouts) == len(loader_ids)  # one layout per micro-batch
        for (ids, cu_seqlens), expected in zip(layouts, loader_ids):
            assert torch.equal(ids, expected)
            rows, seq = expected.shape
            # Segments: one per row, plus one per document starting inside a row.
            inner = int((expected[:, 1:] != expected[:, :-1]).sum())
            assert len(cu_seqlens) - 1 == rows + inner and int(cu_seqlens[-1]) == rows * seq
            boundaries += inner
    assert boundaries > 0  # the data really packs several documents into some rows

    # deterministic: true — megatron's deterministic_mode, torch's deterministic algorithms, TE's switch, and
    # Inductor's (megatron's compiled fusions pick no kernel by timing)
    assert records["switches"] and all(sw == {"torch_deterministic": True, "megatron_deterministic_mode": True,
                                              "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "0",
                                              "inductor_deterministic": True}
                                       for sw in records["switches"])
