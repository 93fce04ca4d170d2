"""The fine-tuning loop shared by all families: AdamW, linear warmup then linear decay, step/epoch budget."""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedTokenizerBase, get_linear_schedule_with_warmup
from transformers.utils import logging as hf_logging

# A run counts as diverged when its loss goes non-finite or ends this many times above where it started.
DIVERGENCE_FACTOR = 1.5


@dataclass(frozen=True)
class FinetuneConfig:
    """One fine-tuning run. The budget is min(max_steps, max_epochs passes over train)."""

    learning_rate: float
    seed: int = 0
    max_steps: int = 1000
    max_epochs: int = 1
    batch_size: int = 32
    eval_batch_size: int = 64
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        for name in ("max_steps", "max_epochs", "batch_size", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}")


@dataclass
class TrainLog:
    steps: int
    losses: list[float] = field(default_factory=list)
    diverged: bool = False

    @property
    def first_loss(self) -> float:
        return self.losses[0] if self.losses else float("nan")

    @property
    def last_loss(self) -> float:
        tail = self.losses[-max(1, len(self.losses) // 10):]
        return float(np.mean(tail)) if tail else float("nan")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"{model_dir} is not a Hugging Face model directory (no config.json)")
    hf_logging.set_verbosity_error()  # newly initialised heads are expected; the warning is noise here
    hf_logging.disable_progress_bar()  # one bar per weight load would drown the bar over runs
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if not tokenizer.is_fast:
        raise ValueError(f"{model_dir}: evaluation needs a fast tokenizer (offsets, word ids)")
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"{model_dir}: the tokenizer has neither a pad nor an eos token to pad with")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def pad_batch(features: Sequence[dict[str, list[int]]], pad_values: dict[str, int]) -> dict[str, torch.Tensor]:
    """Right-pad the list-valued fields named in `pad_values`; other fields become tensors as they are."""
    batch: dict[str, torch.Tensor] = {}
    for key in features[0]:
        values = [f[key] for f in features]
        if key in pad_values:
            width = max(len(v) for v in values)
            values = [list(v) + [pad_values[key]] * (width - len(v)) for v in values]
        batch[key] = torch.tensor(values)
    return batch


def budget_steps(num_examples: int, config: FinetuneConfig) -> int:
    return min(config.max_steps, config.max_epochs * math.ceil(num_examples / config.batch_size))


def train(model: torch.nn.Module, features: Sequence[Any], collate: Callable[[list], Any],
          loss_of_batch: Callable[[torch.nn.Module, Any], torch.Tensor], config: FinetuneConfig,
          description: str = "fine-tune") -> TrainLog:
    """Run the step budget; stops early (diverged) on a non-finite loss."""
    if not features:
        raise ValueError(f"{description}: no training examples")
    steps = budget_steps(len(features), config)
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 or "norm" in n.lower()]
    decay = [p for n, p in model.named_parameters() if not (p.ndim < 2 or "norm" in n.lower())]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config.learning_rate)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(config.warmup_fraction * steps), steps)
    loader = DataLoader(list(features), batch_size=config.batch_size, shuffle=True, collate_fn=collate,
                        generator=torch.Generator().manual_seed(config.seed))
    log = TrainLog(steps=steps)
    model.train()
    batches = iter(loader)
    for _ in tqdm(range(steps), desc=description, leave=False, dynamic_ncols=True):
        try:
            batch = next(batches)
        except StopIteration:
            batches = iter(loader)
            batch = next(batches)
        loss = loss_of_batch(model, batch)
        value = float(loss.detach())
        log.losses.append(value)
        if not math.isfinite(value):
            log.diverged = True
            break
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    if not log.diverged and log.last_loss > DIVERGENCE_FACTOR * log.first_loss:
        log.diverged = True
    model.eval()
    return log


def batched(items: Sequence[Any], size: int):
    for start in range(0, len(items), size):
        yield items[start:start + size]


@dataclass
class RunOutcome:
    """Metrics per evaluated split (e.g. {"validation": {"accuracy": 0.8}, "test": {...}}) and the train log."""

    metrics: dict[str, dict[str, float]]
    log: TrainLog
