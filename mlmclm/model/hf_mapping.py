"""Declared tables between megatron-core parameter names and Hugging Face names, and the functions that apply one.

Each architecture has one table (EuroBERT/Llama's here, `MAPPINGS`; ModernBERT's in mlmclm/model/modernbert/
hf_mapping.py; `mlmclm.model.architectures.mapping_table` picks it); the same table serves both directions and
tensor-parallel sharding. Megatron names here are those of a *full* model (global layer numbers, TP=1, local-layer
spec); `to_te_name` / `from_te_name` translate the Transformer Engine spec's fused-norm names. HF EuroBERT uses
Llama's parameter names, so Llama checkpoints map the same way.

An entry with several HF names fuses them along dim 0 in order (q, k, v; gate, up); an entry of kind QKV or GATE_UP
with one HF name maps a tensor already fused that way on the HF side (ModernBERT's `Wqkv`, `Wi`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from mlmclm.model.config import ModelConfig

# How a tensor is laid out across tensor-parallel ranks.
REPLICATED = "replicated"  # norms: every rank holds all of it
ROWS = "rows"  # split along dim 0: column-parallel linears, vocab-parallel embedding/output
COLUMNS = "columns"  # split along dim 1: row-parallel linears (attention output, MLP down)
QKV = "qkv"  # fused [q; k; v] per query group, groups split along dim 0
GATE_UP = "gate_up"  # fused [gate; up], each half split along dim 0


# Which layers a per-layer entry covers (ModernBERT's layer 0 has no attention norm of its own).
ALL_LAYERS, FIRST_LAYER, LATER_LAYERS = "all", "first", "later"


@dataclass(frozen=True)
class ParamMapping:
    megatron: str  # with "{layer}" for per-layer entries
    hf: tuple[str, ...]  # one name, or the parts of a fused tensor in order
    split: str
    layers: str = ALL_LAYERS  # per-layer entries: every layer, only layer 0, or every layer after it

    def layer_numbers(self, num_layers: int) -> Iterable[int | None]:
        if "{layer}" not in self.megatron:
            return [None]
        return {ALL_LAYERS: range(num_layers), FIRST_LAYER: range(min(1, num_layers)),
                LATER_LAYERS: range(1, num_layers)}[self.layers]


MAPPINGS: tuple[ParamMapping, ...] = (
    ParamMapping("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), ROWS),
    ParamMapping("decoder.layers.{layer}.input_layernorm.weight", ("model.layers.{layer}.input_layernorm.weight",),
                 REPLICATED),
    ParamMapping("decoder.layers.{layer}.self_attention.linear_qkv.weight",
                 ("model.layers.{layer}.self_attn.q_proj.weight", "model.layers.{layer}.self_attn.k_proj.weight",
                  "model.layers.{layer}.self_attn.v_proj.weight"), QKV),
    ParamMapping("decoder.layers.{layer}.self_attention.linear_proj.weight",
                 ("model.layers.{layer}.self_attn.o_proj.weight",), COLUMNS),
    ParamMapping("decoder.layers.{layer}.pre_mlp_layernorm.weight",
                 ("model.layers.{layer}.post_attention_layernorm.weight",), REPLICATED),
    ParamMapping("decoder.layers.{layer}.mlp.linear_fc1.weight",
                 ("model.layers.{layer}.mlp.gate_proj.weight", "model.layers.{layer}.mlp.up_proj.weight"), GATE_UP),
    ParamMapping("decoder.layers.{layer}.mlp.linear_fc2.weight", ("model.layers.{layer}.mlp.down_proj.weight",),
                 COLUMNS),
    ParamMapping("decoder.final_layernorm.weight", ("model.norm.weight",), REPLICATED),
    ParamMapping("output_layer.weight", ("lm_head.weight",), ROWS),
)

# Transformer Engine fuses the pre-attention / pre-MLP norms into the following linear layer.
_TE_RENAMES = (
    (".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight"),
    (".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight"),
)


def to_te_name(name: str) -> str:
    for local, te in _TE_RENAMES:
        if name.endswith(local):
            return name[: -len(local)] + te
    return name


def from_te_name(name: str) -> str:
    for local, te in _TE_RENAMES:
        if name.endswith(te):
            return name[: -len(te)] + local
    return name


def _expand(pattern: str, layer: int | None) -> str:
    return pattern.format(layer=layer) if layer is not None else pattern


def iter_mappings(num_layers: int, table: tuple[ParamMapping, ...] = MAPPINGS,
                  ) -> Iterable[tuple[str, tuple[str, ...], str]]:
    """(megatron name, hf names, split) for every parameter of a full model."""
    for m in table:
        for layer in m.layer_numbers(num_layers):
            yield _expand(m.megatron, layer), tuple(_expand(h, layer) for h in m.hf), m.split


def megatron_names(num_layers: int, table: tuple[ParamMapping, ...] = MAPPINGS) -> list[str]:
    return [name for name, _, _ in iter_mappings(num_layers, table)]


# --- fused tensors ---------------------------------------------------------------------------------------------

def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """HF q/k/v → megatron's fused layout: for each KV group, its query heads, then its key, then its value."""
    groups, d = cfg.num_kv_heads, cfg.head_dim
    per_group = cfg.num_attention_heads // groups
    hidden = q.shape[-1]
    q = q.reshape(groups, per_group * d, hidden)
    k = k.reshape(groups, d, hidden)
    v = v.reshape(groups, d, hidden)
    return torch.cat([q, k, v], dim=1).reshape(-1, hidden)


def split_qkv(qkv: torch.Tensor, cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, d = cfg.num_kv_heads, cfg.head_dim
    per_group = cfg.num_attention_heads // groups
    hidden = qkv.shape[-1]
    grouped = qkv.reshape(groups, (per_group + 2) * d, hidden)
    q, k, v = torch.split(grouped, [per_group * d, d, d], dim=1)
    return q.reshape(-1, hidden), k.reshape(-1, hidden), v.reshape(-1, hidden)


# --- HF <-> full megatron ----------------------------------------------------------------------------------------

def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    if tensor.shape[0] == rows:
        return tensor
    if tensor.shape[0] > rows:
        raise ValueError(f"tensor has {tensor.shape[0]} rows, more than the padded vocabulary {rows}")
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])


def _hf_qkv_parts(qkv: torch.Tensor, cfg: ModelConfig) -> list[torch.Tensor]:
    """An HF tensor holding [q; k; v] (all query heads, then the KV heads' keys, then their values)."""
    d = cfg.head_dim
    return list(torch.split(qkv, [cfg.num_attention_heads * d, cfg.num_kv_heads * d, cfg.num_kv_heads * d]))


def hf_to_megatron(get_hf: Callable[[str], torch.Tensor], cfg: ModelConfig, padded_vocab: int,
                   table: tuple[ParamMapping, ...] = MAPPINGS) -> Iterable[tuple[str, torch.Tensor]]:
    """Yield full megatron tensors one at a time from an HF tensor getter (streams: no whole-model dict needed).
    Vocabulary-split (ROWS) tensors — embedding, output layer, its bias — are padded to `padded_vocab` rows."""
    for name, hf_names, split in iter_mappings(cfg.num_layers, table):
        parts = [get_hf(h) for h in hf_names]
        if split == QKV:
            tensor = fuse_qkv(*(parts if len(parts) == 3 else _hf_qkv_parts(parts[0], cfg)), cfg)
        elif split == GATE_UP:
            tensor = torch.cat(parts, dim=0)
        else:
            tensor = parts[0]
        if split == ROWS:
            tensor = _pad_rows(tensor, padded_vocab)
        yield name, tensor


def megatron_to_hf(get_megatron: Callable[[str], torch.Tensor], cfg: ModelConfig,
                   table: tuple[ParamMapping, ...] = MAPPINGS) -> Iterable[tuple[str, torch.Tensor]]:
    """Yield HF tensors one at a time from a full-megatron tensor getter; vocabulary padding is dropped."""
    for name, hf_names, split in iter_mappings(cfg.num_layers, table):
        tensor = get_megatron(name)
        if split == QKV:
            q_k_v = split_qkv(tensor, cfg)
            yield from zip(hf_names, q_k_v) if len(hf_names) == 3 else [(hf_names[0], torch.cat(q_k_v))]
        elif split == GATE_UP and len(hf_names) == 2:
            yield from zip(hf_names, torch.chunk(tensor, 2, dim=0))
        elif split == ROWS:
            yield hf_names[0], tensor[: cfg.vocab_size]
        else:
            yield hf_names[0], tensor


# --- tensor-parallel sharding ------------------------------------------------------------------------------------

def split_of(name: str, tables: tuple[tuple[ParamMapping, ...], ...] = (MAPPINGS,)) -> str:
    """The TP split kind of a full-megatron parameter name (local or TE naming), from the first of `tables` that
    maps it (the same megatron name has the same split in every architecture's table)."""
    generic = re.sub(r"\.layers\.\d+\.", ".layers.{layer}.", from_te_name(name))
    for table in tables:
        for m in table:
            if m.megatron == generic:
                return m.split
    raise KeyError(f"no mapping for megatron parameter {name!r}")


def shard(tensor: torch.Tensor, split: str, tp_size: int, tp_rank: int) -> torch.Tensor:
    """The slice of a full tensor that TP rank `tp_rank` of `tp_size` holds."""
    if split == REPLICATED or tp_size == 1:
        return tensor
    if split in (ROWS, QKV):  # QKV groups are contiguous, so a row split hands out whole groups
        return torch.chunk(tensor, tp_size, dim=0)[tp_rank]
    if split == COLUMNS:
        return torch.chunk(tensor, tp_size, dim=1)[tp_rank]
    if split == GATE_UP:
        gate, up = torch.chunk(tensor, 2, dim=0)
        return torch.cat([torch.chunk(gate, tp_size, 0)[tp_rank], torch.chunk(up, tp_size, 0)[tp_rank]])
    raise ValueError(f"unknown split {split!r}")


def unshard(shards: list[torch.Tensor], split: str) -> torch.Tensor:
    """Inverse of `shard`: the full tensor from every TP rank's slice, in rank order."""
    if split == REPLICATED or len(shards) == 1:
        return shards[0]
    if split in (ROWS, QKV):
        return torch.cat(shards, dim=0)
    if split == COLUMNS:
        return torch.cat(shards, dim=1)
    if split == GATE_UP:
        halves = [torch.chunk(s, 2, dim=0) for s in shards]
        return torch.cat([torch.cat([g for g, _ in halves]), torch.cat([u for _, u in halves])])
    raise ValueError(f"unknown split {split!r}")
