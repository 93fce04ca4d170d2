"""Token classification (NER-style BIO tags): transformers' token head, or under EncodEval's rules its SL head
(encodeval_heads.py) on `text + EOS` inputs (encodeval_inputs.py); each word labelled on its first sub-token or
(EncodEval) on all of them with a majority vote — under EncodEval's rules its tokens are the ones its start-offset
scan gives the word (a lone-space token goes to the next word) and its vote breaks ties in CPython's set order
(encodeval_tc.py); scored by seqeval's entity F1 and EncodEval's per-sentence macro F1."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForTokenClassification

from mlmclm.eval.finetune.loading import load_options
from mlmclm.eval.finetune.device import on_device
from mlmclm.eval.finetune.encodeval_heads import EncodEvalTokenClassifier
from mlmclm.eval.finetune.encodeval_inputs import encodeval_tokenizer, text_inputs
from mlmclm.eval.finetune.encodeval_tc import encodeval_token_words, encodeval_vote
from mlmclm.eval.finetune.metrics import entity_f1, sentence_macro_f1
from mlmclm.eval.finetune.task_spec import TaskData
from mlmclm.eval.finetune.training import (ENCODEVAL_EVAL_BATCH_SIZE, FinetuneConfig, RunOutcome, batched,
                                           in_precision, load_tokenizer, max_length_of, pad_batch, seed_everything,
                                           train, trainer_forward)

IGNORE = -100


def token_words(offsets: list[tuple[int, int]], words: list[str]) -> list[int | None]:
    """Per token, the index of the word it belongs to, from the tokens' character offsets in `" ".join(words)`.
    Special tokens (empty offsets) and tokens inside a separator belong to no word (None); a word cut by max_length,
    or of nothing the tokenizer keeps, has no token."""
    word_at = []  # character position -> word index, -1 on the separating spaces
    for index, word in enumerate(words):
        word_at += [index] * len(word) + [-1]
    return [next((word_at[c] for c in range(start, min(end, len(word_at))) if word_at[c] >= 0), None)
            for start, end in offsets]


def encode_words(tokenizer, rows, tag_ids: dict[str, int] | None, max_length: int, token_labels: str = "first",
                 encodeval: bool = False) -> list[dict]:
    """Tokenize each row's words as running text, `" ".join(tokens)` (`encodeval`: + EOS, no BOS, as TC.py
    tokenize), and label each word's first sub-token (`token_labels="first"`) or every sub-token with the word's
    tag ("every", EncodEval's labelling). Which tokens are a word's: those overlapping its characters, or
    (`encodeval`) those EncodEval's start-offset scan gives it, a lone separating space included.

    Not `is_split_into_words`: a byte-level BPE (the embedded tokenizer, EuroBERT's) then encodes every word as if
    it began the text, without its leading space — `Macbeth` becomes `M ac beth` instead of the `ĠMacbeth` the
    model saw in pretraining — so fine-tuning would read pieces the pretrained model hardly knows."""
    texts = [" ".join(row["tokens"]) for row in rows]
    encoded = (text_inputs(tokenizer, texts, max_length, offsets=True) if encodeval else
               tokenizer(texts, truncation=True, max_length=max_length, return_offsets_mapping=True))
    features = []
    for index, row in enumerate(rows):
        owners = (encodeval_token_words if encodeval else token_words)(encoded["offset_mapping"][index], row["tokens"])
        tokens_of: dict[int, list[int]] = {}  # word -> its token positions, in order
        for position, word in enumerate(owners):
            if word is not None:
                tokens_of.setdefault(word, []).append(position)
        if token_labels == "first":
            tokens_of = {word: positions[:1] for word, positions in tokens_of.items()}
        feature = {"input_ids": encoded["input_ids"][index], "attention_mask": encoded["attention_mask"][index],
                   "_word_tokens": tokens_of, "_words": len(row["tokens"])}
        if tag_ids is not None:
            labels = [IGNORE] * len(feature["input_ids"])
            for word, positions in tokens_of.items():
                for position in positions:
                    labels[position] = tag_ids[row["tags"][word]]
            feature["labels"] = labels
        features.append(feature)
    return features


def voted_tags(feature: dict, predicted_ids: list[int], labels: list[str], encodeval: bool = False) -> dict[int, str]:
    """Word -> predicted tag, for the words that kept a token: the most frequent prediction over the word's labelled
    tokens (one token under "first" labelling). Ties go to the smaller tag id, or (`encodeval`) to the id met first
    in CPython's set order, EncodEval's `max(set(preds), key=preds.count)` (encodeval_tc.encodeval_vote)."""
    tags = {}
    for word, positions in feature["_word_tokens"].items():
        votes = [predicted_ids[p] for p in positions]
        tags[word] = labels[encodeval_vote(votes) if encodeval else max(sorted(set(votes)), key=votes.count)]
    return tags


def word_predictions(feature: dict, predicted_ids: list[int], labels: list[str], encodeval: bool = False) -> list[str]:
    """One tag per word; "O" for words without a token (e.g. truncated)."""
    words = ["O"] * feature["_words"]
    for word, tag in voted_tags(feature, predicted_ids, labels, encodeval).items():
        words[word] = tag
    return words


def scored_words(feature: dict, predicted_ids: list[int], gold_tags: list[str], labels: list[str],
                 encodeval: bool = False) -> tuple[list[str], list[str]]:
    """(gold, predicted) tags of the words EncodEval's per-sentence score reads: the words that kept a token, in
    word order (a word cut by max_length is in neither list; TC.py get_token_predictions_labels)."""
    voted = voted_tags(feature, predicted_ids, labels, encodeval)
    return [gold_tags[word] for word in sorted(voted)], [voted[word] for word in sorted(voted)]


def run_token_classification(model_dir: Path, data: TaskData, config: FinetuneConfig,
                             eval_splits: tuple[str, ...] = ("validation", "test")) -> RunOutcome:
    encodeval = data.spec.rules == "encodeval"
    tokenizer = encodeval_tokenizer(model_dir) if encodeval else load_tokenizer(model_dir)
    tag_ids = {tag: i for i, tag in enumerate(data.labels)}
    seed_everything(config.seed)
    if encodeval:
        model = EncodEvalTokenClassifier(model_dir, len(data.labels))
    else:
        model = AutoModelForTokenClassification.from_pretrained(
            model_dir, num_labels=len(data.labels), id2label=dict(enumerate(data.labels)), label2id=tag_ids,
            trust_remote_code=False, **load_options())
    model = in_precision(model, config)
    pads = {"input_ids": tokenizer.pad_token_id, "attention_mask": 0, "labels": IGNORE}
    max_length = max_length_of(data.spec, model_dir)

    def collate(feats):
        return pad_batch([{k: v for k, v in f.items() if not k.startswith("_")} for f in feats], pads)

    features = encode_words(tokenizer, data["train"], tag_ids, max_length, data.spec.token_labels, encodeval)
    log = train(model, features, collate, lambda m, b: m(**b).loss, config,
                f"{data.spec.name} lr={config.learning_rate:g}")

    # EncodEval evaluates the model the Trainer prepared (its forward under autocast), in batches of 4
    forward = trainer_forward(model, config)
    eval_batch_size = ENCODEVAL_EVAL_BATCH_SIZE if encodeval else config.eval_batch_size
    metrics = {}
    for split in eval_splits:
        rows = data[split]
        predicted_tags, kept_gold, kept_predicted = [], [], []
        with torch.no_grad():
            features = encode_words(tokenizer, rows, None, max_length, data.spec.token_labels, encodeval)
            for start, chunk in zip(range(0, len(features), eval_batch_size), batched(features, eval_batch_size)):
                predicted = forward(**on_device(collate(chunk), config.device)).logits.argmax(-1).tolist()
                for offset, (feature, ids) in enumerate(zip(chunk, predicted)):
                    predicted_tags.append(word_predictions(feature, ids, data.labels, encodeval))
                    gold, kept = scored_words(feature, ids, rows[start + offset]["tags"], data.labels, encodeval)
                    kept_gold.append(gold)
                    kept_predicted.append(kept)
        metrics[split] = {"entity_f1": entity_f1([r["tags"] for r in rows], predicted_tags),
                          "sentence_macro_f1": sentence_macro_f1(kept_gold, kept_predicted)}
    return RunOutcome(metrics=metrics, log=log)
