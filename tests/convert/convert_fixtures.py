"""Tiny models, a tiny tokenizer and a TP=2×PP=2 training checkpoint for the conversion tests (all built here)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from mlmclm.model import ModelConfig

SHAPE = ModelConfig(num_layers=4, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                    vocab_size=200, max_position_embeddings=64, rope_theta=500.0, make_vocab_divisible_by=64,
                    name="conv-test")
WORDS = ["the", "cat", "dog", "sat", "on", "mat", "a", "red", "blue", "ran", "fast", "slow", "hello", "world"]
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|mask|>", "<|pad|>", "<unk>"]


def make_tokenizer(out_dir: Path) -> Path:
    """A word-level fast tokenizer with EuroBERT's special-token roles (ids 0..4), written by this test."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A <|end_of_text|>", special_tokens=[("<|begin_of_text|>", 0), ("<|end_of_text|>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIALS[0], eos_token=SPECIALS[1],
                                   mask_token=SPECIALS[2], pad_token=SPECIALS[3], unk_token=SPECIALS[4])
    fast.save_pretrained(str(out_dir))
    return out_dir


def hf_kwargs(shape: ModelConfig) -> dict:
    return dict(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size, num_hidden_layers=shape.num_layers,
                num_attention_heads=shape.num_attention_heads, num_key_value_heads=shape.num_kv_heads,
                intermediate_size=shape.ffn_hidden_size, max_position_embeddings=shape.max_position_embeddings,
                rms_norm_eps=shape.norm_eps, bos_token_id=0, eos_token_id=1, pad_token_id=3,
                rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta})


def make_random_eurobert(out_dir: Path, seed: int = 0) -> Path:
    """A random HF EuroBertForMaskedLM with non-trivial norms (so a norm mix-up cannot go unnoticed)."""
    from transformers import EuroBertConfig, EuroBertForMaskedLM

    torch.manual_seed(seed)
    model = EuroBertForMaskedLM(EuroBertConfig(**hf_kwargs(SHAPE), mask_token_id=2, tie_word_embeddings=False))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn_like(param))
    model.save_pretrained(str(out_dir))
    return out_dir


def train_config_dict(run_dir: Path, tokenizer: str, tp: int, pp: int) -> dict:
    from mlmclm.objectives import ObjectiveConfig
    from mlmclm.parallel import ParallelConfig
    from mlmclm.train.config import DataConfig, PhaseConfig, TrainConfig

    return TrainConfig(run_dir=str(run_dir), model=SHAPE, data=DataConfig(path=str(run_dir / "data"),
                                                                          tokenizer=tokenizer),
                       phases=[PhaseConfig(ObjectiveConfig("clm"), steps=4), PhaseConfig(ObjectiveConfig("mlm"),
                                                                                         steps=6)],
                       total_steps=10, global_batch_size=4, parallel=ParallelConfig(tp, pp)).to_dict()


def save_training_checkpoint(hf_dir: str, run_dir: str, tokenizer_dir: str, tp: int, pp: int,
                             iteration: int) -> None:
    """Spawned on tp*pp ranks: our model with the HF weights, DDP + distributed optimizer, save_checkpoint."""
    import torch.distributed as dist
    from safetensors.torch import load_file

    from mlmclm.data.tokenizer import load_tokenizer, tokenizer_identity
    from mlmclm.model import build_model
    from mlmclm.model.hf_mapping import hf_to_megatron
    from mlmclm.model.weights import load_full_weights
    from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel
    from mlmclm.train.checkpoint import save_checkpoint
    from mlmclm.train.optim import OptimizerConfig, ScheduleConfig, build_optimizer, wrap_ddp
    from mlmclm.train.schedule_restarts import build_scheduler

    parallel = ParallelConfig(tensor_parallel=tp, pipeline_parallel=pp)
    init_parallel(parallel, seed=1)
    try:
        hf = load_file(str(Path(hf_dir) / "model.safetensors"))
        full = dict(hf_to_megatron(hf.__getitem__, SHAPE, SHAPE.padded_vocab_size(tp)))
        chunks = build_model(SHAPE, parallel, causal=True)
        load_full_weights(chunks, full.__getitem__)
        ddp = wrap_ddp(chunks, distributed_optimizer=True)
        opt_cfg = OptimizerConfig(weight_decay=0.0)
        optimizer = build_optimizer(ddp, opt_cfg)
        scheduler = build_scheduler(optimizer, opt_cfg, ScheduleConfig(), total_steps=10)
        # One Adam step on zero gradients creates the optimizer state a real checkpoint has (megatron cannot
        # save an optimizer that never stepped) and leaves the weights exactly as loaded (no weight decay).
        for chunk in ddp:
            chunk.zero_grad_buffer()
        optimizer.zero_grad()
        optimizer.step()
        state = {"iteration": iteration, "consumed_tokens": iteration * 4 * 32, "phase_index": 1,
                 "phase_name": "mlm", "seq_length": 32,
                 "tokenizer": tokenizer_identity(load_tokenizer(tokenizer_dir))}
        save_checkpoint(Path(run_dir) / "checkpoints", iteration, ddp, optimizer, scheduler, state,
                        train_config_dict(Path(run_dir), tokenizer_dir, tp, pp))
        dist.barrier()
    finally:
        destroy_parallel()


def megatron_logits_worker(checkpoints: list[str], tokens_path: str, out_path: str, causal: bool) -> None:
    """Spawned on 1 rank: logits of our TP=1 model loaded from each checkpoint (any saved layout)."""
    from mlmclm.convert.to_hf import open_checkpoint
    from mlmclm.convert.verify import megatron_logits
    from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel

    init_parallel(ParallelConfig(), seed=0)
    try:
        tokens = torch.load(tokens_path)
        out = [megatron_logits(open_checkpoint(Path(c)).path, open_checkpoint(Path(c)).model, tokens, causal=causal)
               for c in checkpoints]
        torch.save(out, out_path)
    finally:
        destroy_parallel()


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def assert_untouched(out: Path, before: list[str] | None = None):
    """The output is absent (or exactly as it was) and no staging directory was left beside it."""
    if before is None:
        assert not out.exists()
    else:
        assert sorted(p.name for p in out.iterdir()) == before
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


def tool_main(name: str):
    """`main` of the CLI as `python tools/NAME.py` runs it (loaded in-process: a fresh interpreter costs seconds)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[2] / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main
