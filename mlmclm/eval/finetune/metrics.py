"""Task metrics (accuracy, entity F1, EncodEval's per-sentence macro F1, SQuAD EM/F1, NDCG@10) and the 95 % confidence interval used in summaries."""
from __future__ import annotations

import collections
import math
import re
import string
from collections.abc import Sequence

import numpy as np
from scipy import stats
from seqeval.metrics import f1_score as _seqeval_f1


def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    if len(predictions) != len(labels):
        raise ValueError(f"accuracy: {len(predictions)} predictions for {len(labels)} labels")
    if not labels:
        raise ValueError("accuracy: no examples")
    return float(np.mean(np.asarray(predictions) == np.asarray(labels)))


def entity_f1(true_tags: Sequence[Sequence[str]], predicted_tags: Sequence[Sequence[str]]) -> float:
    """Micro F1 over entity spans; a span counts only when type, start and end all match. seqeval's default mode
    (conlleval's chunking: an entity opens at B-, or at I- after O or another type) reads IOB2 and IOB1 tags alike
    (tags.py; tests/eval/test_tag_schemes.py checks it against strict IOB2 after conversion)."""
    if len(true_tags) != len(predicted_tags):
        raise ValueError(f"entity_f1: {len(predicted_tags)} predicted sequences for {len(true_tags)} gold ones")
    for index, (gold, pred) in enumerate(zip(true_tags, predicted_tags)):
        if len(gold) != len(pred):
            raise ValueError(f"entity_f1: sequence {index} has {len(gold)} gold tags but {len(pred)} predictions")
    return float(_seqeval_f1([list(t) for t in true_tags], [list(p) for p in predicted_tags], zero_division=0))


def sentence_macro_f1(true_tags: Sequence[Sequence[str]], predicted_tags: Sequence[Sequence[str]]) -> float:
    """EncodEval's token-classification score: per sentence, the macro F1 over the tags (O included) that occur in
    its gold or predicted word tags — a tag never right scores 0 — then the mean over sentences. A sentence that is
    all O and predicted all O scores 1.0, so entity-free sentences lift the score well above entity F1's."""
    if len(true_tags) != len(predicted_tags):
        raise ValueError(f"sentence_macro_f1: {len(predicted_tags)} predicted sequences for {len(true_tags)} gold ones")
    if not true_tags:
        raise ValueError("sentence_macro_f1: no sequences")
    scores = []
    for index, (gold, pred) in enumerate(zip(true_tags, predicted_tags)):
        if len(gold) != len(pred):
            raise ValueError(f"sentence_macro_f1: sequence {index} has {len(gold)} gold tags but {len(pred)} "
                             f"predictions")
        if not gold:
            raise ValueError(f"sentence_macro_f1: sequence {index} has no words to score")
        per_tag = []
        for tag in set(gold) | set(pred):
            hits = sum(g == tag and p == tag for g, p in zip(gold, pred))
            per_tag.append(2 * hits / (gold.count(tag) + pred.count(tag)))  # F1 = 2TP / (2TP + FP + FN)
        scores.append(float(np.mean(per_tag)))
    return float(np.mean(scores))


_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, drop punctuation and English articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _f1_pair(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    if not pred_tokens or not gold_tokens:  # unanswerable: only an empty prediction is right
        return float(pred_tokens == gold_tokens)
    common = collections.Counter(pred_tokens) & collections.Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Sequence[str], gold_answers: Sequence[Sequence[str]]) -> dict[str, float]:
    """Exact match and token F1 as fractions in [0, 1], best over the gold answers; an empty gold list means unanswerable."""
    if len(predictions) != len(gold_answers):
        raise ValueError(f"squad_scores: {len(predictions)} predictions for {len(gold_answers)} questions")
    if not predictions:
        raise ValueError("squad_scores: no questions")
    exact, f1 = [], []
    for prediction, golds in zip(predictions, gold_answers):
        golds = list(golds) or [""]
        exact.append(max(float(normalize_answer(prediction) == normalize_answer(g)) for g in golds))
        f1.append(max(_f1_pair(prediction, g) for g in golds))
    return {"exact_match": float(np.mean(exact)), "f1": float(np.mean(f1))}


def ndcg_at_k(ranked_doc_ids: Sequence[Sequence[str]], relevant: Sequence[set[str] | dict[str, float]],
              k: int = 10) -> float:
    """Mean NDCG@k over queries; `relevant[i]` is a set (gain 1) or a dict doc_id -> graded gain."""
    if len(ranked_doc_ids) != len(relevant):
        raise ValueError(f"ndcg_at_k: {len(ranked_doc_ids)} rankings for {len(relevant)} relevance sets")
    if not ranked_doc_ids:
        raise ValueError("ndcg_at_k: no queries")
    scores = []
    for ranking, rel in zip(ranked_doc_ids, relevant):
        gains = rel if isinstance(rel, dict) else {doc: 1.0 for doc in rel}
        dcg = sum(gains.get(doc, 0.0) / math.log2(rank + 2) for rank, doc in enumerate(ranking[:k]))
        ideal = sorted(gains.values(), reverse=True)[:k]
        idcg = sum(g / math.log2(rank + 2) for rank, g in enumerate(ideal))
        scores.append(dcg / idcg if idcg > 0 else 0.0)
    return float(np.mean(scores))


def mean_ci95(values: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of the two-sided 95 % Student-t interval; the half-width is NaN for one value."""
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        raise ValueError("mean_ci95: no values")
    mean = float(array.mean())
    if array.size == 1:
        return mean, float("nan")
    half_width = stats.t.ppf(0.975, df=array.size - 1) * array.std(ddof=1) / math.sqrt(array.size)
    return mean, float(half_width)
