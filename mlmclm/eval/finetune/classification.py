"""Sequence classification (single texts or pairs), scored by accuracy: transformers' head with mean pooling, or
under EncodEval's rules its SL head (encodeval_heads.py) on `text + EOS` inputs (encodeval_inputs.py)."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

from mlmclm.eval.finetune.loading import load_options
from mlmclm.eval.finetune.device import on_device
from mlmclm.eval.finetune.encodeval_heads import EncodEvalSequenceClassifier
from mlmclm.eval.finetune.encodeval_inputs import encodeval_tokenizer, text_inputs
from mlmclm.eval.finetune.metrics import accuracy
from mlmclm.eval.finetune.task_spec import TaskData, TaskSpec
from mlmclm.eval.finetune.training import (ENCODEVAL_EVAL_BATCH_SIZE, FinetuneConfig, RunOutcome, batched,
                                           in_precision, load_tokenizer, max_length_of, pad_batch, seed_everything,
                                           train, trainer_forward)


def encode_rows(tokenizer, spec: TaskSpec, rows, label_ids, max_length):
    """Token ids and label per row: a single text, a text pair, or (with `spec.pair_template`) a pair written
    into one text. Under EncodEval's rules one text per row, as `text + EOS` without BOS (SC.py tokenize)."""
    texts = [r["text"] for r in rows]
    pairs = [r.get("text_pair") for r in rows]
    has_pairs = any(p is not None for p in pairs)
    if has_pairs and not all(p is not None for p in pairs):
        raise ValueError(f"task {spec.name!r}: some rows have 'text_pair' and some do not; use one form per task")
    if has_pairs and spec.pair_template is not None:
        texts = [spec.pair_template.format(text=t, text_pair=p) for t, p in zip(texts, pairs)]
        has_pairs = False
    if spec.rules == "encodeval":
        if has_pairs:
            raise ValueError(f"task {spec.name!r}: EncodEval reads one text per row: give a pair_template")
        encoded = text_inputs(tokenizer, texts, max_length)
    else:
        encoded = tokenizer(texts, pairs if has_pairs else None, truncation=True, max_length=max_length)
    return [{"input_ids": ids, "attention_mask": mask, "labels": label_ids[r["label"]]}
            for ids, mask, r in zip(encoded["input_ids"], encoded["attention_mask"], rows)]


def run_classification(model_dir: Path, data: TaskData, config: FinetuneConfig,
                       eval_splits: tuple[str, ...] = ("validation", "test")) -> RunOutcome:
    encodeval = data.spec.rules == "encodeval"
    tokenizer = encodeval_tokenizer(model_dir) if encodeval else load_tokenizer(model_dir)
    label_ids = {label: i for i, label in enumerate(data.labels)}
    seed_everything(config.seed)
    if encodeval:
        model = EncodEvalSequenceClassifier(model_dir, len(data.labels))
    else:
        model_type = AutoConfig.from_pretrained(model_dir, trust_remote_code=False).model_type
        extra = {"classifier_pooling": "mean"} if model_type == "eurobert" else {}
        model = AutoModelForSequenceClassification.from_pretrained(
            model_dir, num_labels=len(data.labels), id2label={i: str(l) for l, i in label_ids.items()},
            label2id={str(l): i for l, i in label_ids.items()}, trust_remote_code=False, **load_options(), **extra)
        model.config.pad_token_id = tokenizer.pad_token_id
    model = in_precision(model, config)
    pads = {"input_ids": tokenizer.pad_token_id, "attention_mask": 0}
    collate = lambda feats: pad_batch(feats, pads)  # noqa: E731
    features = encode_rows(tokenizer, data.spec, data["train"], label_ids, max_length_of(data.spec, model_dir))
    log = train(model, features, collate, lambda m, b: m(**b).loss, config, f"{data.spec.name} lr={config.learning_rate:g}")

    # EncodEval evaluates the model the Trainer prepared (its forward under autocast), in batches of 4
    forward = trainer_forward(model, config)
    eval_batch_size = ENCODEVAL_EVAL_BATCH_SIZE if encodeval else config.eval_batch_size
    metrics = {}
    for split in eval_splits:
        eval_features = encode_rows(tokenizer, data.spec, data[split], label_ids, max_length_of(data.spec, model_dir))
        predictions = []
        with torch.no_grad():
            for chunk in batched(eval_features, eval_batch_size):
                batch = on_device(collate(chunk), config.device)
                batch.pop("labels")
                predictions.extend(forward(**batch).logits.argmax(-1).tolist())
        metrics[split] = {"accuracy": accuracy(predictions, [f["labels"] for f in eval_features])}
    return RunOutcome(metrics=metrics, log=log)
