"""EncodEval's scores for extractive QA and retrieval, each computed as its evaluator computes it — the quantities
the paper's released `results/` hold, which are not the SQuAD F1 or the nDCG@10 everyone else reports (those stay
in `metrics.py`, reported beside these as the standard scores).

Where read: EncodEval's evaluator files are not in the stored copy of `hgissbkh/EncodEval` (branch `MLM_vs_CLM`,
commit 7e03774: only `encodeval/datasets.py`, `encodeval/eval_tasks/abstract_eval.py`, `configs/`, `results/`).
They were read in `rimads/avey-b`, folder `EncodEval/`, whose README says it is modified from that branch, at its
first commit 810ad06 ("add all files"; QA.py is unchanged in substance up to 8f3ed57), and each rule below is
checked against what the branch's released `results/<model>/<QA|IR>/.../results.json` hold (`scores_i`, one score
per question or query). Pure functions of token positions, labels and scores.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

RETRIEVED = 10  # IR.py get_predictions_labels_at_k(k=10): the ten most similar documents are scored


def qa_answer_positions(offsets: Sequence[tuple[int, int]], sequence_ids: Sequence[int | None],
                        answer_start: int | None, answer_text: str | None) -> list[int]:
    """The token positions EncodEval labels "inside the answer" (label 1; every other position is 0).

    Read in rimads/avey-b EncodEval/encodeval/eval_tasks/QA.py `tokenize`: only the *first* gold answer
    (`answer_start[0]`, `text[0]`); none -> no position. The context is the run of tokens of the second sequence
    (sequence id 1). When the context's first token starts after the answer's end, or its last token ends before
    the answer's start (the answer cut away by truncation), no position. Otherwise the start is the last context
    token whose start offset is <= the answer's first character, the end the token after the last one (scanning
    back from the context's end) whose end offset is < the answer's end character, and every position from start
    to end is inside. EncodEval writes `[0]*start + [1]*(end-start+1) + [0]*(n-end-1)`: when the answer runs past a
    truncated context, end = n and that list is one longer than the input (its collator would then fail); here the
    positions are clipped to the input.
    The released results hold scores, not positions: this rule is read in the code only."""
    if answer_start is None or answer_text is None:
        return []
    start_char, end_char = answer_start, answer_start + len(answer_text)
    context = [position for position, sequence in enumerate(sequence_ids) if sequence == 1]
    if not context:
        return []
    context_start = context_end = context[0]
    while context_end + 1 < len(sequence_ids) and sequence_ids[context_end + 1] == 1:
        context_end += 1
    if offsets[context_start][0] > end_char or offsets[context_end][1] < start_char:
        return []
    start = context_start
    while start <= context_end and offsets[start][0] <= start_char:
        start += 1
    start -= 1
    end = context_end
    while end >= context_start and offsets[end][1] >= end_char:
        end -= 1
    end += 1
    if start == 0 and end == 0:
        return []
    return [position for position in range(start, end + 1) if 0 <= position < len(sequence_ids)]


def qa_token_f1(predicted: set[int] | Sequence[int], gold: set[int] | Sequence[int]) -> float | int:
    """One question's score: the F1 between the set of positions predicted inside the answer and the gold set, an
    empty set counted as {0} (position 0, the first token of "Question: ", never inside an answer) — so an
    unanswerable question predicted empty scores 1.

    Read in rimads/avey-b EncodEval/encodeval/eval_tasks/QA.py `compute_f1s`: precision = |p & t| / |p|, recall =
    |p & t| / |t|, F1 = 2 * (precision * recall) / (precision + recall), and the integer 0 when precision + recall
    is 0. Confirmed bit for bit by the released QA `scores_i` (e.g. results/1b-clm-42k/QA/qed/lr1e-04_sd0): their
    integer `0`s, and floats such as 0.33333333333333337 (1 of 1 predicted, 5 gold) or 0.7999999999999999 (6 of 7
    predicted, 8 gold) that this formula gives and 2|p & t| / (|p| + |t|) does not (0.3333333333333333, 0.8)."""
    predicted, gold = set(predicted) or {0}, set(gold) or {0}
    hits = len(predicted & gold)
    precision, recall = hits / len(predicted), hits / len(gold)
    if precision + recall > 0:
        return 2 * (precision * recall) / (precision + recall)
    return 0


def qa_score(predicted: Sequence[set[int]], gold: Sequence[set[int]]) -> float:
    """The mean of `qa_token_f1` over the questions (QA.py: `np.mean(f1s_i)`, the released `score`)."""
    if len(predicted) != len(gold):
        raise ValueError(f"qa_score: {len(predicted)} predictions for {len(gold)} questions")
    if not gold:
        raise ValueError("qa_score: no questions")
    return float(np.mean([qa_token_f1(p, g) for p, g in zip(predicted, gold)]))


def _discount_sums(sizes: Sequence[int]) -> list[float]:
    """Sum of the rank discounts 1 / log2(rank + 1) over each run of consecutive ranks of the given sizes."""
    sums, rank = [], 1
    for size in sizes:
        sums.append(float(sum(1 / np.log2(r + 1) for r in range(rank, rank + size))))
        rank += size
    return sums


def retrieved_ndcg(labels: Sequence[float], scores: Sequence[float]) -> float:
    """nDCG of the retrieved documents alone, as `sklearn.metrics.ndcg_score([labels], [scores])` computes it: the
    DCG of the documents in score order, documents with equal scores sharing their ranks' discounts (the mean gain
    of a tied group times the sum of its ranks' discounts), divided by the DCG of the same labels sorted — the ideal
    of the *retrieved* documents, not of every relevant document; 0 when none is relevant.

    Read in rimads/avey-b EncodEval/encodeval/eval_tasks/IR.py `compute_ndcgs`: `ndcg_score([t], [p])` per query over
    the ten retrieved (`top_k_retrieved`), then the mean. Confirmed by the released IR results
    (results/1b-clm-42k/IR/msmarco/msmarco_pairs_lr1e-04_sd0, test = TREC-DL 2019, dozens of relevant passages per
    query): per-query scores 0.9937947856332161 (relevant at ranks 1-7, 9, 10), 0.9842184869190971 and
    0.47902629279282405 (ranks 4, 9, 10) are this normalisation's; the standard nDCG@10 of a query with ten or more
    relevant passages cannot exceed 0.936 with nine of them in the top ten."""
    labels, scores = np.asarray(labels, dtype=float), np.asarray(scores, dtype=float)
    if labels.shape != scores.shape or labels.ndim != 1:
        raise ValueError(f"retrieved_ndcg: {labels.shape} labels for {scores.shape} scores")
    if labels.size < 2:  # sklearn refuses one document: "only meaningful when there is more than 1 document"
        raise ValueError(f"retrieved_ndcg: nDCG needs at least 2 retrieved documents, got {labels.size}")
    ideal = float(np.dot(np.sort(labels)[::-1], _discount_sums([1] * labels.size)))
    if ideal == 0:
        return 0.0
    if np.isnan(scores).any():  # a diverged run's similarities: NaN, as the groups below would give, without
        return float("nan")     # numpy's empty-slice warnings on the console (NaN equals no score, so its group is empty)
    groups = [labels[scores == value] for value in np.unique(scores)[::-1]]  # best score first
    return float(sum(group.mean() * span for group, span in zip(groups, _discount_sums([len(g) for g in groups]))))\
        / ideal


def top_k_retrieved(similarities: np.ndarray, k: int = RETRIEVED) -> np.ndarray:
    """Per query (row), the column indices of the k most similar documents, in ascending similarity order.

    Read in IR.py `get_predictions_labels_at_k`: `np.argsort(scores)[-k:]` over the corpus in its order. EncodEval's
    argsort is numpy's default (not stable): a tie at the tenth place may keep another document than this stable
    sort does."""
    return np.argsort(similarities, axis=1, kind="stable")[:, -k:]


def retrieval_score(similarities: np.ndarray, relevant: Sequence[set[int]], k: int = RETRIEVED) -> float:
    """EncodEval's retrieval score: per query, `retrieved_ndcg` of the k most similar documents (label 1 when the
    document is relevant, score its similarity), then the mean over the queries. `relevant[i]` holds column indices
    of `similarities`."""
    similarities = np.asarray(similarities, dtype=np.float32)  # sentence-transformers' similarity is fp32
    if similarities.ndim != 2 or len(relevant) != similarities.shape[0]:
        raise ValueError(f"retrieval_score: {len(relevant)} relevance sets for similarities {similarities.shape}")
    if not relevant:
        raise ValueError("retrieval_score: no queries")
    per_query = []
    for row, documents, wanted in zip(similarities, top_k_retrieved(similarities, k), relevant):
        per_query.append(retrieved_ndcg([float(d in wanted) for d in documents], row[documents]))
    return float(np.mean(per_query))
