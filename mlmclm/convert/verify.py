"""Check an export against its checkpoint, naming what differs: the config fields, every tensor, then the logits.

Three checks, each catching what the others cannot: the config as transformers reads it, against the model shape
and tokenizer (a wrong `mask_token_id` or `rms_norm_eps` barely moves logits); every written tensor, bit for bit,
against the checkpoint's (a corrupted row of a token the sample never uses, or a transposed square weight, is
named — logits only say "something differs", and miss rows they never touch); and the logits of our megatron model
vs the HF model on the same inputs (catches a wrong mapping, which the tensor check shares with the export). The
logits run in a fresh 1-rank process (megatron needs its parallel state; the caller's process stays clean) and are
always bidirectional: HF EuroBERT and ModernBERT have no causal mode, so CLM-trained checkpoints are compared as
encoders too.
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from mlmclm.model.config import ModelConfig
from mlmclm.parallel.launch import spawn

BATCH, DEFAULT_VERIFY_LENGTH = 2, 48
SHOWN = 5  # differences listed in an error


class VerificationError(RuntimeError):
    pass


def sample_tokens(vocab: int, max_positions: int, seed: int = 0, length: int = DEFAULT_VERIFY_LENGTH):
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (BATCH, min(length, max_positions)), generator=gen)


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


def _worker(checkpoint: str, hf_dir: str, model_dict: dict, dtype: str, result: str, length: int) -> None:
    import torch
    from transformers import AutoModelForMaskedLM
    from transformers.utils import logging as hf_logging

    from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel

    hf_logging.disable_progress_bar()  # the export's own progress bar has already shown the work
    init_parallel(ParallelConfig(), seed=0)
    try:
        cfg = ModelConfig.from_dict(model_dict)
        tokens = sample_tokens(cfg.vocab_size, cfg.max_position_embeddings, length=length)
        ours = megatron_logits(Path(checkpoint), cfg, tokens, round_to=dtype)
        hf = AutoModelForMaskedLM.from_pretrained(hf_dir, dtype=torch.float32, trust_remote_code=False).eval()
        with torch.no_grad():
            theirs = hf(input_ids=tokens).logits.float()
        Path(result).write_text(json.dumps({"max_abs_diff": (ours - theirs).abs().max().item(),
                                            "max_abs_logit": theirs.abs().max().item()}))
    finally:
        destroy_parallel()


def compare_logits(checkpoint: Path, hf_dir: Path, model_cfg: ModelConfig, dtype: str = "fp32",
                   length: int = DEFAULT_VERIFY_LENGTH) -> float:
    """Max |HF logits − our logits| on seeded random token ids (bidirectional attention), `length` tokens a row
    (at most the model's max positions)."""
    with tempfile.TemporaryDirectory() as tmp, cpu_only():
        result = Path(tmp) / "result.json"
        spawn(_worker, 1, str(checkpoint), str(hf_dir), model_cfg.to_dict(), dtype, str(result), length)
        return json.loads(result.read_text())["max_abs_diff"]


@contextmanager
def cpu_only():
    """The verification process sees no GPU (set before it starts: CUDA is probed when torch is imported there).

    Both models then run on the CPU in fp32, also on a GPU machine: there TE's GEMMs and attention differ from the
    CPU reference by ~2e-4 on the logits (seen on an H200), which says nothing about the mapping being checked."""
    saved = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = saved


def check_config(hf_dir: Path, model: ModelConfig, special_ids: dict, dtype: str) -> None:
    """config.json, as transformers loads it, describes `model` with the tokenizer's special ids."""
    from transformers import AutoConfig

    try:
        hf = AutoConfig.from_pretrained(str(hf_dir), trust_remote_code=False)
    except Exception as err:
        raise VerificationError(f"config.json cannot be loaded: {type(err).__name__}: {err}") from err
    want = _expected_config(model, special_ids, dtype)
    rope = getattr(hf, "rope_parameters", None) or {}
    got = {k: (rope.get(k.split(".", 1)[1]) if k.startswith("rope_parameters.") else getattr(hf, k, None))
           for k in want}
    got["dtype"] = str(got["dtype"]).removeprefix("torch.") if got["dtype"] is not None else None
    wrong = [f"{k}: {got[k]!r} (written) != {v!r} (checkpoint)" for k, v in want.items() if got[k] != v]
    if wrong:
        raise VerificationError(f"config.json differs from the checkpoint's model: {'; '.join(wrong)}")


def _expected_config(model: ModelConfig, special_ids: dict, dtype: str) -> dict:
    """The config fields (`rope_parameters.KEY` for RoPE's) the export must have written for `model`."""
    from mlmclm.convert.hf_config import DTYPES, rope_parameters
    from mlmclm.convert.modernbert_config import modernbert_fields

    if model.is_modernbert:
        fields = modernbert_fields(model, special_ids, dtype)
        rope = fields.pop("rope_parameters")
        return {"model_type": "modernbert", **fields, **{f"rope_parameters.{k}": v for k, v in rope.items()}}
    want = {"model_type": "eurobert", "architectures": ["EuroBertForMaskedLM"], "vocab_size": model.vocab_size,
            "hidden_size": model.hidden_size, "intermediate_size": model.ffn_hidden_size,
            "num_hidden_layers": model.num_layers, "num_attention_heads": model.num_attention_heads,
            "num_key_value_heads": model.num_kv_heads, "head_dim": model.head_dim, "hidden_act": "silu",
            "max_position_embeddings": model.max_position_embeddings, "rms_norm_eps": model.norm_eps,
            "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
            "bos_token_id": special_ids.get("bos_id"), "eos_token_id": special_ids.get("eos_id"),
            "pad_token_id": special_ids.get("pad_id"), "mask_token_id": special_ids.get("mask_id"),
            "dtype": DTYPES[dtype]}
    want.update({f"rope_parameters.{k}": v for k, v in rope_parameters(model).items()})
    return want


def check_tensors(checkpoint: Path, hf_dir: Path, model: ModelConfig, dtype: str) -> None:
    """Every written tensor equals the checkpoint's, cast to the export dtype, bit for bit; none missing or extra.

    Reads one tensor at a time from both sides (as the export does), so memory stays at about one tensor.
    """
    import torch

    from mlmclm.convert.dist_reader import DistCheckpointReader
    from mlmclm.convert.hf_source import HFWeights, SourceError
    from mlmclm.model.architectures import mapping_table
    from mlmclm.model.hf_mapping import megatron_to_hf

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    try:
        written = HFWeights(hf_dir)
    except SourceError as err:
        raise VerificationError(str(err)) from err
    reader = DistCheckpointReader(checkpoint)
    expected, wrong = set(), []
    for name, want in megatron_to_hf(reader.read, model, mapping_table(model)):
        expected.add(name)
        if name not in written:
            continue  # reported with the missing names below
        got = written.get(name)
        want = want.to(torch_dtype)
        if got.dtype != torch_dtype or got.shape != want.shape:
            wrong.append(f"{name}: {got.dtype} {tuple(got.shape)} written, {torch_dtype} {tuple(want.shape)} "
                         f"expected")
        elif not torch.equal(got, want):
            bad = (got != want).nonzero()
            note = " (it is the expected tensor transposed)" if got.dim() == 2 and torch.equal(got, want.T) else ""
            wrong.append(f"{name}: {len(bad)} of {want.numel()} values differ, first at {tuple(bad[0].tolist())}, "
                         f"max |diff| {(got.float() - want.float()).abs().max().item():.3e}{note}")
    missing, extra = sorted(expected - set(written.names())), sorted(set(written.names()) - expected)
    if missing:
        wrong.append(f"missing tensors: {missing[:SHOWN]}")
    if extra:
        wrong.append(f"unexpected tensors: {extra[:SHOWN]}")
    if wrong:
        more = f" (and {len(wrong) - SHOWN} more)" if len(wrong) > SHOWN else ""
        raise VerificationError(f"the written weights differ from the checkpoint {checkpoint}: "
                                f"{'; '.join(wrong[:SHOWN])}{more}")


def verify_export(checkpoint: Path, hf_dir: Path, model: ModelConfig, special_ids: dict, dtype: str = "fp32",
                  tolerance: float = 1e-4, length: int = DEFAULT_VERIFY_LENGTH) -> float:
    """All three checks (cheapest first); raise VerificationError naming what differs, else return the logit diff.

    Messages name files relative to `hf_dir` (during an export it is a staging directory the user never sees).
    """
    check_config(hf_dir, model, special_ids, dtype)
    check_tensors(checkpoint, hf_dir, model, dtype)
    diff = compare_logits(checkpoint, hf_dir, model, dtype, length)
    if not diff <= tolerance:
        raise VerificationError(f"max |logits HF - ours| = {diff:.3e} > tolerance {tolerance:.1e} (the "
                                f"weights and config match the checkpoint: a mapping or modelling difference)")
    return diff
