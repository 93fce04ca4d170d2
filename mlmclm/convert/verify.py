"""Check a conversion: our megatron model (loaded from the dist checkpoint) vs the HF model, same inputs.

Runs in a fresh 1-rank process (megatron needs its parallel state; the caller's process stays clean). Always
bidirectional: HF EuroBERT has no causal mode, so CLM-trained checkpoints are compared as encoders too.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

from mlmclm.model.config import ModelConfig
from mlmclm.parallel.launch import spawn

BATCH, MAX_SEQ = 2, 48


def sample_tokens(vocab: int, max_positions: int, seed: int = 0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (BATCH, min(MAX_SEQ, max_positions)), generator=gen)


def megatron_logits(checkpoint: Path, model_cfg: ModelConfig, tokens, causal: bool = False,
                    round_to: str | None = None):
    """Logits of our model with the checkpoint's weights (call inside an initialised 1-rank process)."""
    import torch

    from mlmclm.model import build_model
    from mlmclm.model.precision import PrecisionConfig
    from mlmclm.parallel import ParallelConfig, current_device
    from mlmclm.train.checkpoint import load_weights

    chunks = build_model(model_cfg, ParallelConfig(), PrecisionConfig(dtype="fp32"), causal=causal)
    load_weights(checkpoint, chunks)
    model = chunks[0].eval()
    if round_to == "bf16":  # compare the same function: the export rounded the weights
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(param.to(torch.bfloat16).float())
    device = current_device()
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    with torch.no_grad():
        logits = model(tokens.to(device), positions.to(device), None)
    return logits[..., : model_cfg.vocab_size].float().cpu()


def _worker(checkpoint: str, hf_dir: str, model_dict: dict, dtype: str, result: str) -> None:
    import torch
    from transformers import AutoModelForMaskedLM

    from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel

    init_parallel(ParallelConfig(), seed=0)
    try:
        cfg = ModelConfig.from_dict(model_dict)
        tokens = sample_tokens(cfg.vocab_size, cfg.max_position_embeddings)
        ours = megatron_logits(Path(checkpoint), cfg, tokens, round_to=dtype)
        hf = AutoModelForMaskedLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
        with torch.no_grad():
            theirs = hf(input_ids=tokens).logits.float()
        Path(result).write_text(json.dumps({"max_abs_diff": (ours - theirs).abs().max().item(),
                                            "max_abs_logit": theirs.abs().max().item()}))
    finally:
        destroy_parallel()


def compare_logits(checkpoint: Path, hf_dir: Path, model_cfg: ModelConfig, dtype: str = "fp32") -> float:
    """Max |HF logits − our logits| on seeded random token ids (bidirectional attention)."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        spawn(_worker, 1, str(checkpoint), str(hf_dir), model_cfg.to_dict(), dtype, str(result))
        return json.loads(result.read_text())["max_abs_diff"]
