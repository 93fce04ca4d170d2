"""The fine-tuning loop shared by all families, as transformers' Trainer runs EncodEval's configs: AdamW
(torch's, not fused: the Trainer's `adamw_torch`), linear warmup then linear decay, step/epoch budget, the
libraries' data order (data_order.py), micro-batches whose token-mean losses are averaged (gradient accumulation),
bf16 under autocast with fp32 losses (precision.py), and a run that goes non-finite scored as if it had stepped to its
end. On the run's device (device.py), with its batches collated ahead by a host thread (prefetch.py) and no host
read inside a step: the losses stay on the device, read every DIVERGENCE_CHECK_STEPS steps and at the end."""
from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoTokenizer, PreTrainedTokenizerBase, get_linear_schedule_with_warmup
from transformers.utils import logging as hf_logging

from mlmclm.eval.finetune import precision
from mlmclm.eval.finetune.data_order import ORDERS, TRAINER, step_rows
from mlmclm.eval.finetune.device import check_device, on_device
from mlmclm.eval.finetune.precision import DTYPES, TrainerForward
from mlmclm.eval.finetune.prefetch import StepPrefetch

# A run counts as diverged when its loss goes non-finite or ends this many times above where it started.
DIVERGENCE_FACTOR = 1.5
# EncodEval's evaluation batches: per_device_eval_batch_size 4 in configs/{SC,TC,QA}/*.yaml and in the IR
# evaluation configs (configs/IR/<set>_msmarco_pairs_*.yaml). Padding is per batch, so the batch is part of the
# numbers in bf16 (and of QA's score, encodeval_qa.py).
ENCODEVAL_EVAL_BATCH_SIZE = 4
# How often the loop reads its losses back from the device (one host read) to see whether the run can stop early:
# it stops only once every trained weight is NaN, when every later step provably changes nothing (`train`).
DIVERGENCE_CHECK_STEPS = 50


@dataclass(frozen=True)
class FinetuneConfig:
    """One fine-tuning run. The budget is min(max_steps, max_epochs passes over train); either may be None (no
    cap of that kind: the paper's SC/QA/IR runs take 1000 steps, going past one epoch on small sets, and its TC
    runs one full epoch). The optimizer is EncodEval's: AdamW β (0.9, 0.95), eps 1e-5, weight decay 0.1."""

    learning_rate: float
    seed: int = 0
    max_steps: int | None = 1000
    max_epochs: int | None = 1
    batch_size: int = 32
    eval_batch_size: int = 64
    warmup_fraction: float = 0.1
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-5
    max_grad_norm: float = 1.0
    dtype: str = "float32"  # a key of DTYPES
    # Rows per forward/backward pass (None: the whole batch). EncodEval's SC/TC/QA configs set
    # per_device_train_batch_size 4 with train_batch_size 32: the Trainer accumulates 8 micro-batches, each
    # micro-batch's token-mean loss divided by their number, so a step's loss is the mean of the micro-batch means.
    micro_batch_size: int | None = None
    # A floor under the epoch cap (never above max_steps): a small training set is repeated for more epochs rather
    # than giving a run a handful of updates. None in the paper suite (EncodEval's budgets as they are).
    min_steps: int | None = None
    # Where the run computes ("cpu", "cuda"; device.py). Not part of what the run is: left out of its fingerprint.
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.max_steps is None and self.max_epochs is None:
            raise ValueError("max_steps and max_epochs cannot both be None (the run would never end)")
        for name in ("max_steps", "max_epochs", "batch_size", "eval_batch_size", "min_steps", "micro_batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1 and self.eps > 0 and self.weight_decay >= 0):
            raise ValueError(f"bad AdamW settings: beta1={self.beta1}, beta2={self.beta2}, eps={self.eps}, "
                             f"weight_decay={self.weight_decay}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}")
        check_device(self.device)
        if self.micro_batch_size is not None and self.batch_size % self.micro_batch_size:
            raise ValueError(f"batch_size ({self.batch_size}) must be a multiple of micro_batch_size "
                             f"({self.micro_batch_size}): a step is a whole number of micro-batches")


@dataclass
class TrainLog:
    steps: int
    losses: list[float] = field(default_factory=list)
    diverged: bool = False
    stopped_at: int | None = None  # the step after which every weight was NaN (the later steps were not run)

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
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
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
    """min(max_steps, max_epochs passes), raised to `min_steps` (more passes over a small set) but never past
    max_steps."""
    caps = [config.max_steps] if config.max_steps is not None else []
    if config.max_epochs is not None:
        caps.append(config.max_epochs * math.ceil(num_examples / config.batch_size))
    steps = min(caps)
    if config.min_steps is not None:
        steps = max(steps, min(config.min_steps, config.max_steps or config.min_steps))
    return steps


def warmup_steps(steps: int, config: FinetuneConfig) -> int:
    """Linear-warmup steps: ceil(fraction x steps), as transformers' Trainer counts a warmup ratio
    (TrainingArguments.get_warmup_steps) — 44 of one CoNLL epoch's 439 steps, where int() gave 43."""
    return math.ceil(config.warmup_fraction * steps)


def default_max_length(model_dir: Path) -> int:
    """EncodEval's input length: 99 % of the model's max_position_embeddings, rounded to the nearest integer as
    theirs is (Python's round: 2028 for 2048, not the 2027 truncation would give)."""
    import json

    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    return round(0.99 * config["max_position_embeddings"])


def max_length_of(spec: Any, model_dir: Path) -> int:
    return spec.max_length if spec.max_length is not None else default_max_length(model_dir)


def in_precision(model: torch.nn.Module, config: FinetuneConfig) -> torch.nn.Module:
    """The model, heads included, in the run's fine-tuning precision and on its device (before the optimizer sees
    it)."""
    return precision.in_precision(model, config.dtype).to(config.device)


def trainer_forward(model: torch.nn.Module, config: FinetuneConfig) -> TrainerForward:
    """`model` called as the Trainer calls it in this run's precision (precision.TrainerForward)."""
    return TrainerForward(model, config.dtype)


def make_optimizer(model: torch.nn.Module, config: FinetuneConfig) -> torch.optim.AdamW:
    """AdamW with the config's betas/eps; weight decay on matrices only (not on norms and biases)."""
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 or "norm" in n.lower()]
    decay = [p for n, p in model.named_parameters() if not (p.ndim < 2 or "norm" in n.lower())]
    # torch's default implementation, not the fused kernel: transformers 4.55 under torch 2.7 (EncodEval's pins)
    # defaults to `adamw_torch` (fused only from torch 2.8), which passes neither `fused` nor `foreach`. The same
    # parameters as the Trainer's groups: no decay on biases and norm weights (get_decay_parameter_names).
    return torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=config.learning_rate,
                             betas=(config.beta1, config.beta2), eps=config.eps)


def accumulate_step(forward: Callable, rows: Sequence[Any], collate: Callable[[list], Any],
                    loss_of_batch: Callable[[Callable, Any], torch.Tensor], micro_batch_size: int | None) -> torch.Tensor:
    """Forward and backward one optimizer step's rows, `micro_batch_size` rows at a time (each micro-batch padded
    on its own, as the Trainer's collator pads each), every micro-batch's loss divided by their number before its
    backward (Trainer.training_step: `loss / current_gradient_accumulation_steps`, the count of this step's
    micro-batches). Returns the step's loss, the mean of the micro-batch losses, detached, on the device."""
    return step_loss(forward, micro_batches(rows, collate, micro_batch_size), loss_of_batch)


def micro_batches(rows: Sequence[Any], collate: Callable[[list], Any], micro_batch_size: int | None) -> list:
    """One step's rows collated `micro_batch_size` at a time (each padded on its own)."""
    return [collate(list(chunk)) for chunk in batched(rows, micro_batch_size or len(rows))]


def step_loss(forward: Callable, batches: Sequence[Any], loss_of_batch: Callable[[Callable, Any], torch.Tensor]
              ) -> torch.Tensor:
    """Forward and backward one step's collated micro-batches (accumulate_step), without reading anything back."""
    total = None
    for batch in batches:
        loss = loss_of_batch(forward, batch) / len(batches)
        loss.backward()
        total = loss.detach() if total is None else total + loss.detach()
    return total


def all_weights_nan(model: torch.nn.Module) -> bool:
    """Whether every trained weight is NaN (one host read). From there every forward is NaN, so every loss and
    gradient is, and AdamW turns NaN weights into NaN weights: the model the run ends with is this one."""
    weights = [p for p in model.parameters() if p.requires_grad]
    return bool(torch.stack([p.isnan().all() for p in weights]).all())


def train(model: torch.nn.Module, features: Sequence[Any], collate: Callable[[list], Any],
          loss_of_batch: Callable[[Callable, Any], torch.Tensor], config: FinetuneConfig,
          description: str = "fine-tune", order: str = TRAINER) -> TrainLog:
    """Run the step budget. `loss_of_batch(forward, batch)` gets the model as the Trainer calls it in the run's
    precision (`trainer_forward`) and the micro-batch on the run's device. A loss that goes non-finite does not
    stop the run by itself: the Trainer keeps stepping and EncodEval scores what it has at the end, so this loop
    scores that model too, and flags the run diverged. Every DIVERGENCE_CHECK_STEPS steps it reads the losses back
    (the only host read of the loop); once one was non-finite it also asks whether every trained weight is NaN —
    a NaN loss makes the clipped gradients NaN everywhere, and AdamW then writes NaN into every weight — and if so
    stops: the later steps could change no weight, no loss (NaN) and no score (`all_weights_nan`), and the log
    records their losses as the NaN they would be (`stopped_at` says where it stopped)."""
    if not features:
        raise ValueError(f"{description}: no training examples")
    if order not in ORDERS:
        raise ValueError(f"unknown data order {order!r}; known: {', '.join(ORDERS)}")
    steps = budget_steps(len(features), config)
    optimizer = make_optimizer(model, config)
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup_steps(steps, config), steps)
    forward = trainer_forward(model, config)
    batches = step_rows(len(features), config.batch_size, config.seed, order)  # the order, fixed before the thread

    def make_step(_: int) -> list:  # on the prefetch thread: this step's micro-batches, collated on the host
        return micro_batches([features[i] for i in next(batches)], collate, config.micro_batch_size)

    model.train()
    losses, checked, non_finite, stopped_at = [], 0, False, None
    with StepPrefetch(make_step, steps, pin=torch.device(config.device).type == "cuda") as prefetch:
        # a bar only on a terminal: in a log file every refresh would be one more line
        for step, host_batches in enumerate(tqdm(prefetch, total=steps, desc=description, leave=False,
                                                 dynamic_ncols=True, disable=not sys.stderr.isatty())):
            losses.append(step_loss(forward, on_device(host_batches, config.device), loss_of_batch))
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            if (step + 1) % DIVERGENCE_CHECK_STEPS == 0 and step + 1 < steps:
                non_finite = non_finite or not bool(torch.stack(losses[checked:]).isfinite().all())
                checked = step + 1
                if non_finite and all_weights_nan(model):
                    stopped_at = step + 1
                    break
    model.eval()
    values = torch.stack(losses).float().tolist() + [math.nan] * (steps - len(losses))
    log = TrainLog(steps=steps, losses=values, stopped_at=stopped_at)
    log.diverged = (not all(math.isfinite(v) for v in log.losses)
                    or log.last_loss > DIVERGENCE_FACTOR * log.first_loss)
    return log


def batched(items: Sequence[Any], size: int):
    for start in range(0, len(items), size):
        yield items[start:start + size]


@dataclass
class RunOutcome:
    """Metrics per evaluated split (e.g. {"validation": {"accuracy": 0.8}, "test": {...}}) and the train log."""

    metrics: dict[str, dict[str, float]]
    log: TrainLog
