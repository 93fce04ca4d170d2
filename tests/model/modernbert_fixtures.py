"""A tiny random Hugging Face `ModernBertForMaskedLM` (transformers' own class and config) for the ModernBERT tests:
both layer types, windows shorter than the test sequences, different global and local RoPE θ, sharp attention, and
norms and decoder bias that are not at their initial values (so a mix-up between them cannot go unnoticed)."""
from __future__ import annotations

from pathlib import Path

import torch

SEQ = 32  # tokens per test row: four times the window below
LOCAL_ATTENTION = 8  # local layers see 4 tokens on each side
GLOBAL_THETA, LOCAL_THETA = 500.0, 50.0


def hf_modernbert_config(vocab_size: int = 200, layers: int = 4, **overrides):
    from transformers import ModernBertConfig

    fields = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                  num_attention_heads=4, max_position_embeddings=64, local_attention=LOCAL_ATTENTION,
                  global_attn_every_n_layers=3, global_rope_theta=GLOBAL_THETA, local_rope_theta=LOCAL_THETA,
                  bos_token_id=0, eos_token_id=1, pad_token_id=3, cls_token_id=0, sep_token_id=1,
                  attn_implementation="eager")
    return ModernBertConfig(**{**fields, **overrides})


def random_modernbert(seed: int = 0, **overrides):
    from transformers import ModernBertForMaskedLM

    torch.manual_seed(seed)
    model = ModernBertForMaskedLM(hf_modernbert_config(**overrides)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1 + 0.1 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.1 * torch.randn_like(param))
            elif "Wqkv" in name:  # sharp attention: positions (RoPE θ, windows) then matter to the logits
                param.mul_(10)
    return model


def save_random_modernbert(out_dir: Path, tokenizer_dir: Path | None = None, seed: int = 0) -> Path:
    model = random_modernbert(seed)
    model.save_pretrained(str(out_dir))
    if tokenizer_dir is not None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(str(tokenizer_dir)).save_pretrained(str(out_dir))
    return out_dir
