"""Split rules: how validation and test rows are drawn when a source does not give them as such.

- `paper_validation_split`: EncodEval's validation = 5 % of train (datasets' train_test_split, seed 42).
- `seeded_query_halves`: NQ's BEIR test queries split 50/50 into validation and test, drawn from the fine-tuning
  seed. EncodEval halves them the same way but *unseeded* (its configs/IR/nq_*.yaml set no seed, so
  abstract_eval.py never calls set_seed before encodeval/datasets.py nq() samples): its halves cannot be
  reproduced, and ours are not its halves.
- `shuffled`: the fixed shuffle (seed 0) behind the derived splits of custom tasks (tasks.load_task).
Pure functions of rows and seeds; a split that cannot be made raises ValueError saying why.
"""
from __future__ import annotations

import math
import random

import numpy as np

PAPER_VALIDATION_FRACTION, PAPER_VALIDATION_SEED = 0.05, 42  # EncodEval: validation = 5 % of train, seed 42
DERIVED_SPLIT_SEED = 0  # fixed so derived validation/test splits are identical across runs and models


def paper_validation_split(rows: list) -> tuple[list, list]:
    """(train, validation): ceil(5 %) of the rows drawn by numpy's default_rng(42) permutation — the selection
    `datasets.Dataset.train_test_split(test_size=0.05, seed=42)` makes — and the rest, both in that order."""
    if len(rows) < 2:
        raise ValueError(f"train has {len(rows)} row(s), too few to hold out a validation split")
    order = np.random.default_rng(PAPER_VALIDATION_SEED).permutation(len(rows))
    held = math.ceil(PAPER_VALIDATION_FRACTION * len(rows))
    return [rows[i] for i in order[held:]], [rows[i] for i in order[:held]]


def seeded_query_halves(rows: list[dict], seed: int) -> tuple[list[dict], list[dict]]:
    """(validation, test) of a retrieval set given as one test split: Python's `random.sample` of round(n / 2)
    query ids, from the ids sorted as strings, with `random.Random(seed)`; the other queries are the test. The draw
    EncodEval makes (the same call, sizes and sort) but seeded, so a run can be repeated — NOT EncodEval's halves,
    which are drawn unseeded and cannot be reproduced. Rows are matched by their `id` (the BEIR query id), else by
    the query text."""
    if len(rows) < 2:
        raise ValueError(f"{len(rows)} query row(s): too few to split into validation and test halves")
    keys = [str(row.get("id", row["query"])) for row in rows]
    if len(set(keys)) != len(keys):
        raise ValueError("query ids (or texts, without ids) repeat: each query must be one row to be halved")
    drawn = set(random.Random(seed).sample(sorted(keys), round(0.5 * len(keys))))
    return ([row for row, key in zip(rows, keys) if key in drawn],
            [row for row, key in zip(rows, keys) if key not in drawn])


def shuffled(rows: list, seed: int = DERIVED_SPLIT_SEED) -> list:
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    return rows
