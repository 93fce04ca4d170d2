"""Fill-mask scoring on held-back text, and what a tiny pretraining run measured on its validation split: shared by
`make demo` (recipes/demo.py) and the mini-replication (recipes/mini.py).

The held-back text is the embedded corpus's last work, which no training or validation split contains; every model
(and a unigram baseline that knows only the training text's token frequencies) is scored on the same masked tokens.
"""
from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path


def validation_losses(run_dir: Path) -> dict[int, dict[str, float]]:
    """step → the held-out CLM and MLM losses logged at that step."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: {k: row[k] for k in ("val/clm/loss", "val/mlm/loss")} for row in rows if "val/clm/loss" in row}


def corpus_split(tokenizer, validation_every: int) -> tuple[int, object, Counter]:
    """Tokens of every work but the last and the validation works (the training data: BOS + text + EOS each), the
    held-back work's text, and the token counts of the training text."""
    from mlmclm.data.corpus import load_works

    works = load_works()
    counts: Counter = Counter()
    total = 0
    for index, work in enumerate(works[:-1]):
        if index % validation_every == validation_every - 1:   # prepare_data's rule: the validation split
            continue
        ids = tokenizer(work.text, add_special_tokens=False)["input_ids"]
        counts.update(ids)
        total += len(ids) + 2
    return total, works[-1], counts


def unigram_entropy(counts: Counter) -> float:
    """Entropy (nats per token) of the training tokens' unigram distribution."""
    import math

    n = sum(counts.values())
    return -sum(c / n * math.log(c / n) for c in counts.values())


def held_back_passages(text: str, count: int, lines_each: int = 6) -> list[str]:
    """`count` passages of `lines_each` consecutive non-empty lines, spread evenly over the held-back work."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    stride = max(lines_each, len(lines) // max(1, count))
    return ["\n".join(lines[i:i + lines_each]) for i in range(0, len(lines) - lines_each, stride)][:count]


def load_mlm(model_dir: Path):
    """The exported model with its masked-LM head, and its tokenizer."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    return (AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False),
            AutoModelForMaskedLM.from_pretrained(model_dir, trust_remote_code=False).eval())


def masked_positions(tokenizer, passages: list[str], mask_ratio: float,
                     seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """Each passage's token ids (first 128) and the positions masked in it: `mask_ratio` of the tokens, drawn with a
    fixed seed, so every model — and the unigram baseline — is scored on the same masked tokens."""
    rng = random.Random(seed)
    out = []
    for passage in passages:
        ids = tokenizer(passage, add_special_tokens=False)["input_ids"][:128]
        out.append((ids, rng.sample(range(len(ids)), max(1, round(mask_ratio * len(ids))))))
    return out


def fill_mask_scores(model_dir: Path, passages: list[str], mask_ratio: float, seed: int = 0):
    """Masked-token cross entropy (nats) and top-1 accuracy on `passages`, masking `mask_ratio` of the tokens the
    way training does (mask token only, positions drawn with a fixed seed: the same for every model)."""
    import torch

    tokenizer, model = load_mlm(model_dir)
    total, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for ids, picked in masked_positions(tokenizer, passages, mask_ratio, seed):
            masked = list(ids)
            for p in picked:
                masked[p] = tokenizer.mask_token_id
            logits = model(input_ids=torch.tensor([masked])).logits[0, picked]
            targets = torch.tensor([ids[p] for p in picked])
            total += torch.nn.functional.cross_entropy(logits, targets, reduction="sum").item()
            correct += (logits.argmax(-1) == targets).sum().item()
            count += len(picked)
    return total / count, correct / count


def unigram_fill_mask_scores(tokenizer, counts: Counter, passages: list[str], mask_ratio: float, seed: int = 0):
    """The fill-mask score of a model that knows only the training text's token frequencies (add-one smoothed over
    the vocabulary, so a token unseen in training costs log(N + V) nats, not infinity), on the same masked tokens
    as `fill_mask_scores`: cross entropy and top-1 accuracy (always guessing the most frequent token)."""
    import math

    n, vocab = sum(counts.values()), len(tokenizer)
    most_frequent = counts.most_common(1)[0][0]
    total, correct, count = 0.0, 0, 0
    for ids, picked in masked_positions(tokenizer, passages, mask_ratio, seed):
        for p in picked:
            total -= math.log((counts.get(ids[p], 0) + 1) / (n + vocab))
            correct += ids[p] == most_frequent
            count += 1
    return total / count, correct / count
