"""Extractive QA (SQuAD / SQuAD-v2 style): span head over the encoder, sliding windows over long contexts,
'no answer' = position 0 (allowed only when the task has unanswerable questions). Scored by EM / F1 — the standard
score. Under EncodEval's rules a run fine-tunes two models from the same weights, seed and budget: EncodEval's token
tagger (encodeval_qa.py, its `encodeval_f1`, the main metric) and this span model (`f1`, `exact_match`, reported
beside it), so QA runs of the paper suite take twice the fine-tuning; the record's loss and steps are the tagger's."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from mlmclm.eval.finetune.device import on_device
from mlmclm.eval.finetune.encodeval_qa import run_encodeval_qa
from mlmclm.eval.finetune.heads import SpanQAModel
from mlmclm.eval.finetune.metrics import squad_scores
from mlmclm.eval.finetune.task_spec import TaskData
from mlmclm.eval.finetune.training import (FinetuneConfig, RunOutcome, batched, in_precision, load_tokenizer,
                                           max_length_of, pad_batch, seed_everything, train)

MAX_ANSWER_TOKENS = 30
TOP_K = 20


def _encode(tokenizer, rows, max_length):
    """Windows over each context; training targets are token positions, or 0 when the answer is not inside."""
    encoded = tokenizer([r["question"] for r in rows], [r["context"] for r in rows], truncation="only_second",
                        max_length=max_length, stride=max_length // 4, return_overflowing_tokens=True,
                        return_offsets_mapping=True)
    features = []
    for index in range(len(encoded["input_ids"])):
        example = encoded["overflow_to_sample_mapping"][index]
        sequence_ids = encoded.sequence_ids(index)
        offsets = [o if s == 1 else None for o, s in zip(encoded["offset_mapping"][index], sequence_ids)]
        answers = rows[example]["answers"]
        start_position = end_position = 0
        if answers["text"]:
            char_start = answers["answer_start"][0]
            char_end = char_start + len(answers["text"][0])
            inside = [i for i, o in enumerate(offsets) if o is not None and o[0] < char_end and o[1] > char_start]
            context_tokens = [i for i, o in enumerate(offsets) if o is not None]
            if inside and offsets[context_tokens[0]][0] <= char_start and offsets[context_tokens[-1]][1] >= char_end:
                start_position, end_position = inside[0], inside[-1]
        features.append({"input_ids": encoded["input_ids"][index], "attention_mask": encoded["attention_mask"][index],
                         "start_positions": start_position, "end_positions": end_position,
                         "_example": example, "_offsets": offsets})
    return features


def _span_loss(model, batch):
    start, end = model(batch["input_ids"], batch["attention_mask"])
    return (nn.functional.cross_entropy(start, batch["start_positions"])
            + nn.functional.cross_entropy(end, batch["end_positions"])) / 2


def _best_answers(rows, features, start_logits, end_logits, allow_no_answer):
    """Best-scoring valid span per example across its windows; '' when the null score beats it (v2 only)."""
    best = {i: (-np.inf, "") for i in range(len(rows))}
    null = {i: np.inf for i in range(len(rows))}
    for feature, start, end in zip(features, start_logits, end_logits):
        example, offsets = feature["_example"], feature["_offsets"]
        null[example] = min(null[example], start[0] + end[0])
        for s in np.argsort(start)[::-1][:TOP_K]:
            for e in np.argsort(end)[::-1][:TOP_K]:
                if s >= len(offsets) or e >= len(offsets) or offsets[s] is None or offsets[e] is None:
                    continue
                if e < s or e - s + 1 > MAX_ANSWER_TOKENS:
                    continue
                score = start[s] + end[e]
                if score > best[example][0]:
                    best[example] = (score, rows[example]["context"][offsets[s][0]:offsets[e][1]])
    return [("" if allow_no_answer and null[i] > best[i][0] else best[i][1]) for i in range(len(rows))]


def run_qa(model_dir: Path, data: TaskData, config: FinetuneConfig,
           eval_splits: tuple[str, ...] = ("validation", "test")) -> RunOutcome:
    if data.spec.rules != "encodeval":
        return run_span_qa(model_dir, data, config, eval_splits)
    tagger = run_encodeval_qa(model_dir, data, config, eval_splits)
    span = run_span_qa(model_dir, data, config, eval_splits)
    return RunOutcome(metrics={split: {**tagger.metrics[split], **span.metrics[split]} for split in eval_splits},
                      log=tagger.log)


def run_span_qa(model_dir: Path, data: TaskData, config: FinetuneConfig,
                eval_splits: tuple[str, ...] = ("validation", "test")) -> RunOutcome:
    tokenizer = load_tokenizer(model_dir)
    allow_no_answer = any(not r["answers"]["text"] for split in data.splits.values() for r in split)
    seed_everything(config.seed)
    model = in_precision(SpanQAModel(model_dir), config)
    pads = {"input_ids": tokenizer.pad_token_id, "attention_mask": 0}

    def collate(feats):
        return pad_batch([{k: v for k, v in f.items() if not k.startswith("_")} for f in feats], pads)

    features = _encode(tokenizer, data["train"], max_length_of(data.spec, model_dir))
    log = train(model, features, collate, _span_loss, config, f"{data.spec.name} lr={config.learning_rate:g}")

    metrics = {}
    for split in eval_splits:
        rows = data[split]
        eval_features = _encode(tokenizer, rows, max_length_of(data.spec, model_dir))
        starts, ends = [], []
        with torch.no_grad():
            for chunk in batched(eval_features, config.eval_batch_size):
                batch = on_device(collate(chunk), config.device)
                start, end = (logits.float().cpu() for logits in model(batch["input_ids"], batch["attention_mask"]))
                for i, f in enumerate(chunk):
                    starts.append(start[i, : len(f["input_ids"])].float().numpy())
                    ends.append(end[i, : len(f["input_ids"])].float().numpy())
        predictions = _best_answers(rows, eval_features, starts, ends, allow_no_answer)
        metrics[split] = squad_scores(predictions, [r["answers"]["text"] for r in rows])
    return RunOutcome(metrics=metrics, log=log)
