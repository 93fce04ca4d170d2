"""The order fine-tuning reads its training rows in: the order of the library EncodEval trains each family with, so
that a seed is the same run in both systems.

- `"trainer"` (SC, TC, QA: transformers' Trainer 4.55 under accelerate 1.9.0, EncodEval's pins). The Trainer
  samples with a `RandomSampler` that accelerate's `prepare_data_loader` swaps for its `SeedableRandomSampler`
  (`use_seedable_sampler`, on by default). That sampler's seed is `torch.initial_seed()` (the Trainer's
  `set_seed(args.seed)`), and at every epoch it reseeds a fresh generator with seed + epoch and draws one
  permutation: epoch e reads `torch.randperm(n, generator=torch.Generator().manual_seed(seed + e))`.
- `"sentence_transformers"` (IR: sentence-transformers 3.4.1's trainer). `get_train_dataloader` makes one
  `torch.Generator()` and seeds it only `if args.seed`: at seed 0 it keeps torch's default seed. Its
  `DefaultBatchSampler` wraps a `SubsetRandomSampler` on that generator, which accelerate leaves alone, so every
  epoch draws the next `torch.randperm(n, generator=generator)` from the same generator.

Either way an epoch is cut into consecutive batches, the last one shorter (`dataloader_drop_last` is False).
(A plain `DataLoader(shuffle=True, generator=...)` first draws a base seed from its generator, which gives another
order: the rule is written out here instead.)
"""
from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch

TRAINER = "trainer"
SENTENCE_TRANSFORMERS = "sentence_transformers"
ORDERS = (TRAINER, SENTENCE_TRANSFORMERS)


def epoch_orders(n: int, seed: int, rule: str = TRAINER) -> Iterator[list[int]]:
    """Each epoch's permutation of range(n), epoch 0 first, without end."""
    if n < 1:
        raise ValueError(f"epoch_orders: no rows to order (n={n})")
    if rule == TRAINER:
        for epoch in itertools.count():
            yield torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    elif rule == SENTENCE_TRANSFORMERS:
        generator = torch.Generator()
        if seed:  # sentence-transformers' `if self.args.seed:` — seed 0 keeps the generator's default seed
            generator.manual_seed(seed)
        while True:
            yield torch.randperm(n, generator=generator).tolist()
    else:
        raise ValueError(f"unknown data order {rule!r}; known: {', '.join(ORDERS)}")


def step_rows(n: int, batch_size: int, seed: int, rule: str = TRAINER) -> Iterator[list[int]]:
    """The row indices of each optimizer step, without end: consecutive `batch_size` slices of each epoch's
    permutation, the epoch's last slice shorter when batch_size does not divide n."""
    if batch_size < 1:
        raise ValueError(f"step_rows: batch_size must be >= 1, got {batch_size}")
    for order in epoch_orders(n, seed, rule):
        for start in range(0, n, batch_size):
            yield order[start:start + batch_size]
