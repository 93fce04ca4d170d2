"""Token classification (NER-style BIO tags): transformers' token head, first sub-token per word, entity F1."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForTokenClassification

from mlmclm.eval.metrics import entity_f1
from mlmclm.eval.tasks import TaskData
from mlmclm.eval.training import (FinetuneConfig, RunOutcome, batched, in_precision, load_tokenizer, max_length_of,
                                  pad_batch, seed_everything, train)

IGNORE = -100


def first_tokens(offsets: list[tuple[int, int]], words: list[str]) -> dict[int, int]:
    """Word index -> index of its first token, from the tokens' character offsets in `" ".join(words)`. Special
    tokens (empty offsets) and tokens inside a separator belong to no word; a word left with no token (cut by
    max_length, or nothing the tokenizer keeps) is absent."""
    word_at = []  # character position -> word index, -1 on the separating spaces
    for index, word in enumerate(words):
        word_at += [index] * len(word) + [-1]
    first: dict[int, int] = {}
    for position, (start, end) in enumerate(offsets):
        word = next((word_at[c] for c in range(start, min(end, len(word_at))) if word_at[c] >= 0), None)
        if word is not None and word not in first:
            first[word] = position
    return first


def encode_words(tokenizer, rows, tag_ids: dict[str, int] | None, max_length: int) -> list[dict]:
    """Tokenize each row's words as running text, `" ".join(tokens)`, and label only each word's first token.

    Not `is_split_into_words`: a byte-level BPE (the embedded tokenizer, EuroBERT's) then encodes every word as if
    it began the text, without its leading space — `Macbeth` becomes `M ac beth` instead of the `ĠMacbeth` the
    model saw in pretraining — so fine-tuning would read pieces the pretrained model hardly knows."""
    texts = [" ".join(row["tokens"]) for row in rows]
    encoded = tokenizer(texts, truncation=True, max_length=max_length, return_offsets_mapping=True)
    features = []
    for index, row in enumerate(rows):
        first = first_tokens(encoded["offset_mapping"][index], row["tokens"])
        feature = {"input_ids": encoded["input_ids"][index], "attention_mask": encoded["attention_mask"][index],
                   "_first_tokens": first, "_words": len(row["tokens"])}
        if tag_ids is not None:
            labels = [IGNORE] * len(feature["input_ids"])
            for word, position in first.items():
                labels[position] = tag_ids[row["tags"][word]]
            feature["labels"] = labels
        features.append(feature)
    return features


def word_predictions(feature: dict, predicted_ids: list[int], labels: list[str]) -> list[str]:
    """One tag per word: the prediction at its first token; "O" for words without a token (e.g. truncated)."""
    words = ["O"] * feature["_words"]
    for word, position in feature["_first_tokens"].items():
        words[word] = labels[predicted_ids[position]]
    return words


def run_token_classification(model_dir: Path, data: TaskData, config: FinetuneConfig,
                             eval_splits: tuple[str, ...] = ("validation", "test")) -> RunOutcome:
    tokenizer = load_tokenizer(model_dir)
    tag_ids = {tag: i for i, tag in enumerate(data.labels)}
    seed_everything(config.seed)
    model = AutoModelForTokenClassification.from_pretrained(
        model_dir, num_labels=len(data.labels), id2label=dict(enumerate(data.labels)), label2id=tag_ids)
    model = in_precision(model, config)
    pads = {"input_ids": tokenizer.pad_token_id, "attention_mask": 0, "labels": IGNORE}
    max_length = max_length_of(data.spec, model_dir)

    def collate(feats):
        return pad_batch([{k: v for k, v in f.items() if not k.startswith("_")} for f in feats], pads)

    features = encode_words(tokenizer, data["train"], tag_ids, max_length)
    log = train(model, features, collate, lambda m, b: m(**b).loss, config,
                f"{data.spec.name} lr={config.learning_rate:g}")

    metrics = {}
    for split in eval_splits:
        rows = data[split]
        predicted_tags = []
        with torch.no_grad():
            for chunk in batched(encode_words(tokenizer, rows, None, max_length), config.eval_batch_size):
                for feature, ids in zip(chunk, model(**collate(chunk)).logits.argmax(-1).tolist()):
                    predicted_tags.append(word_predictions(feature, ids, data.labels))
        metrics[split] = {"entity_f1": entity_f1([r["tags"] for r in rows], predicted_tags)}
    return RunOutcome(metrics=metrics, log=log)
