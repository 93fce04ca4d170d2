"""Token classification (NER-style BIO tags): transformers' token head, first sub-token per word, entity F1."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForTokenClassification

from mlmclm.eval.metrics import entity_f1
from mlmclm.eval.tasks import TaskData
from mlmclm.eval.training import (FinetuneConfig, RunOutcome, batched, load_tokenizer, max_length_of, pad_batch,
                                  seed_everything, train)

IGNORE = -100


def _encode(tokenizer, rows, tag_ids, max_length):
    """Label only each word's first sub-token; `word_ids` lets predictions map back to words."""
    encoded = tokenizer([r["tokens"] for r in rows], is_split_into_words=True, truncation=True,
                        max_length=max_length)
    features = []
    for index, row in enumerate(rows):
        word_ids = encoded.word_ids(index)
        labels, previous = [], None
        for word in word_ids:
            first = word is not None and word != previous
            labels.append(tag_ids.get(row["tags"][word], 0) if first else IGNORE)
            previous = word
        features.append({"input_ids": encoded["input_ids"][index], "attention_mask": encoded["attention_mask"][index],
                         "labels": labels, "_word_ids": word_ids})
    return features


def run_token_classification(model_dir: Path, data: TaskData, config: FinetuneConfig,
                             eval_splits: tuple[str, ...] = ("validation", "test")) -> RunOutcome:
    tokenizer = load_tokenizer(model_dir)
    tag_ids = {tag: i for i, tag in enumerate(data.labels)}
    seed_everything(config.seed)
    model = AutoModelForTokenClassification.from_pretrained(
        model_dir, num_labels=len(data.labels), id2label=dict(enumerate(data.labels)), label2id=tag_ids)
    pads = {"input_ids": tokenizer.pad_token_id, "attention_mask": 0, "labels": IGNORE}

    def collate(feats):
        return pad_batch([{k: v for k, v in f.items() if not k.startswith("_")} for f in feats], pads)

    features = _encode(tokenizer, data["train"], tag_ids, max_length_of(data.spec, model_dir))
    log = train(model, features, collate, lambda m, b: m(**b).loss, config, f"{data.spec.name} lr={config.learning_rate:g}")

    metrics = {}
    for split in eval_splits:
        rows = data[split]
        eval_features = _encode(tokenizer, rows, tag_ids, max_length_of(data.spec, model_dir))
        predicted_tags = []
        with torch.no_grad():
            for chunk in batched(eval_features, config.eval_batch_size):
                batch = collate(chunk)
                batch.pop("labels")
                for feature, ids in zip(chunk, model(**batch).logits.argmax(-1).tolist()):
                    predicted_tags.append(_word_predictions(feature["_word_ids"], ids, data.labels))
        # words cut off by truncation are predicted "O"
        padded = [(p + ["O"] * len(r["tokens"]))[: len(r["tokens"])] for p, r in zip(predicted_tags, rows)]
        metrics[split] = {"entity_f1": entity_f1([r["tags"] for r in rows], padded)}
    return RunOutcome(metrics=metrics, log=log)


def _word_predictions(word_ids, predicted_ids, labels):
    words, previous = [], None
    for word, label_id in zip(word_ids, predicted_ids):
        if word is not None and word != previous:
            words.append(labels[label_id])
        previous = word
    return words
