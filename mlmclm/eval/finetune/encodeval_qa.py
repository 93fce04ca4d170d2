"""Extractive QA as EncodEval runs it: not a start/end span head but token tagging — a token-classification head
with 2 labels (inside / outside the first gold answer) over "Question: {q}\\nContext: " + context + EOS, one input
per question (the context cut, no windows), scored by the F1 between the predicted-inside and gold-inside token
positions (encodeval_scores.py). Read in rimads/avey-b EncodEval/encodeval/eval_tasks/QA.py at 810ad06 and in
hgissbkh/EncodEval@MLM_vs_CLM configs/QA/*.yaml (`AutoModelForTokenClassification`, `num_labels: 2`,
`per_device_eval_batch_size: 4`); the released QA `scores_i` are this score (encodeval_scores.qa_token_f1).

Predictions at padding positions count: QA.py takes the argmax of every position of its padded evaluation batches
(4 questions, in order) and calls each position predicted 1 inside the answer, padding included (its gold labels
pad with -100, never 1). This module evaluates in the same batches of 4, so the score is EncodEval's to the
batch."""
from __future__ import annotations

from pathlib import Path

import torch

from mlmclm.eval.finetune.device import on_device
from mlmclm.eval.finetune.encodeval_heads import EncodEvalTokenClassifier
from mlmclm.eval.finetune.encodeval_inputs import encodeval_tokenizer, qa_inputs
from mlmclm.eval.finetune.encodeval_scores import qa_answer_positions, qa_score
from mlmclm.eval.finetune.task_spec import TaskData
from mlmclm.eval.finetune.training import (ENCODEVAL_EVAL_BATCH_SIZE, FinetuneConfig, RunOutcome, batched,
                                           in_precision, max_length_of, pad_batch, seed_everything, train,
                                           trainer_forward)

EVAL_BATCH_SIZE = ENCODEVAL_EVAL_BATCH_SIZE  # configs/QA/*.yaml per_device_eval_batch_size: what the score sees
IGNORE = -100  # DataCollatorForTokenClassification's label padding


def encode_questions(tokenizer, rows, max_length: int) -> list[dict]:
    """One input per question; labels 1 on the first gold answer's tokens, 0 everywhere else (question included)."""
    encoded = qa_inputs(tokenizer, [r["question"] for r in rows], [r["context"] for r in rows], max_length)
    features = []
    for index, row in enumerate(rows):
        answers = row["answers"]
        first = (answers["answer_start"][0], answers["text"][0]) if answers["text"] else (None, None)
        ids = encoded["input_ids"][index]
        inside = set(qa_answer_positions(encoded["offset_mapping"][index], encoded.sequence_ids(index), *first))
        features.append({"input_ids": ids, "attention_mask": encoded["attention_mask"][index],
                         "labels": [int(position in inside) for position in range(len(ids))]})
    return features


def predicted_inside(model, features: list[dict], collate, device: str = "cpu") -> list[set[int]]:
    """Per question, the positions of its padded batch of EVAL_BATCH_SIZE the model tags inside (label 1).
    `model`: any callable (the run passes it as the Trainer calls it, training.trainer_forward)."""
    out = []
    with torch.no_grad():
        for chunk in batched(features, EVAL_BATCH_SIZE):
            batch = on_device(collate(chunk), device)
            batch.pop("labels")
            predicted = model(**batch).logits.argmax(-1).cpu()  # one read per batch of 4, not per question
            out += [set(torch.nonzero(row == 1).flatten().tolist()) for row in predicted]
    return out


def run_encodeval_qa(model_dir: Path, data: TaskData, config: FinetuneConfig,
                     eval_splits: tuple[str, ...] = ("validation", "test")) -> RunOutcome:
    tokenizer = encodeval_tokenizer(model_dir)
    max_length = max_length_of(data.spec, model_dir)
    seed_everything(config.seed)
    model = in_precision(EncodEvalTokenClassifier(model_dir, num_labels=2), config)
    pads = {"input_ids": tokenizer.pad_token_id, "attention_mask": 0, "labels": IGNORE}

    def collate(features):
        return pad_batch(features, pads)

    log = train(model, encode_questions(tokenizer, data["train"], max_length), collate, lambda m, b: m(**b).loss,
                config, f"{data.spec.name} lr={config.learning_rate:g}")
    metrics = {}
    for split in eval_splits:
        features = encode_questions(tokenizer, data[split], max_length)
        gold = [{p for p, label in enumerate(f["labels"]) if label == 1} for f in features]
        # EncodEval evaluates the model the Trainer prepared: its forward under autocast
        predicted = predicted_inside(trainer_forward(model, config), features, collate, config.device)
        metrics[split] = {"encodeval_f1": qa_score(predicted, gold)}
    return RunOutcome(metrics=metrics, log=log)
