"""EncodEval's QA and retrieval scores (mlmclm/eval/finetune/encodeval_scores.py) against independent oracles: the
released per-question / per-query scores of hgissbkh/EncodEval@MLM_vs_CLM `results/` (values copied from those files),
the rule's own worked examples, and `sklearn.metrics.ndcg_score` — what EncodEval's IR.py calls."""
import math
import random

import numpy as np
import pytest

from mlmclm.eval.finetune.encodeval_scores import (qa_answer_positions, qa_score, qa_token_f1, retrieval_score,
                                                   retrieved_ndcg, top_k_retrieved)
from mlmclm.eval.finetune.metrics import ndcg_at_k

sklearn_metrics = pytest.importorskip("sklearn.metrics")

# results/1b-clm-42k/QA/qed/lr1e-04_sd0/results.json, validation scores_i: values the rule must give bit for bit,
# with the (predicted, gold, shared) position counts that give them
RELEASED_QA = {0.33333333333333337: (1, 5, 1), 0.7999999999999999: (7, 8, 6), 0.8000000000000002: (5, 5, 4),
               0.9354838709677419: (29, 33, 29), 0.19999999999999998: (1, 9, 1), 0.888888888888889: (4, 5, 4),
               0.9600000000000001: (12, 13, 12), 0.09375: (6, 58, 3)}


def _sets(predicted, gold, shared):
    return set(range(predicted)), set(range(predicted - shared, predicted - shared + gold))


def test_qa_f1_reproduces_the_released_per_question_scores_bit_for_bit():
    for released, counts in RELEASED_QA.items():
        p, t = _sets(*counts)
        assert len(p & t) == counts[2]
        assert qa_token_f1(p, t) == released  # exact: 2PR/(P+R) with P, R as fractions, as QA.py computes it
    p, t = _sets(1, 5, 1)
    assert 2 * len(p & t) / (len(p) + len(t)) != 0.33333333333333337  # the set-size form would not match
    miss = qa_token_f1({3}, {7, 8})
    assert miss == 0 and isinstance(miss, int)  # the released files' integer 0s


def test_qa_f1_counts_an_empty_set_as_position_zero():
    assert qa_token_f1(set(), set()) == 1.0  # unanswerable, predicted empty
    assert qa_token_f1({0}, set()) == 1.0
    assert qa_token_f1({5, 6}, set()) == 0  # unanswerable, an answer predicted
    assert qa_token_f1(set(), {5, 6}) == 0  # answerable, nothing predicted
    assert qa_token_f1({0, 5}, set()) == pytest.approx(2 / 3)  # P 1/2, R 1
    assert qa_score([set(), {5}], [set(), {5, 6}]) == pytest.approx((1 + 2 / 3) / 2)
    with pytest.raises(ValueError, match="no questions"):
        qa_score([], [])


# "Question: where does bob live ?\nContext: " + "bob lives in rome . <eos>": word tokens with their offsets; the
# question is sequence 0 (positions 0-6), the context sequence 1 (positions 7-12), as the tokenizer returns them
QUESTION = [(0, 9), (10, 15), (16, 20), (21, 24), (25, 29), (30, 31), (32, 40)]
CONTEXT = [(0, 3), (4, 9), (10, 12), (13, 17), (18, 19), (19, 34)]
OFFSETS, SEQUENCE_IDS = QUESTION + CONTEXT, [0] * 7 + [1] * 6


def test_qa_labels_follow_encodevals_scan_of_the_first_answer():
    assert qa_answer_positions(OFFSETS, SEQUENCE_IDS, 13, "rome") == [10]
    assert qa_answer_positions(OFFSETS, SEQUENCE_IDS, 4, "lives in rome") == [8, 9, 10]
    assert qa_answer_positions(OFFSETS, SEQUENCE_IDS, 14, "om") == [10]  # inside one token: that token
    assert qa_answer_positions(OFFSETS, SEQUENCE_IDS, None, None) == []  # unanswerable: all outside
    truncated = OFFSETS[:10], SEQUENCE_IDS[:10]  # the context cut after "in": the answer is not in the input
    assert qa_answer_positions(*truncated, 13, "rome") == []
    # the answer runs past the cut: EncodEval's end is one past the input (its list one too long); clipped here
    assert qa_answer_positions(*truncated, 4, "lives in rome") == [8, 9]
    # the first context token starts after the answer's first character: the start steps back one token, into the
    # question (EncodEval's scan does; the answer is then labelled from "Context: " on)
    shifted = QUESTION + [(2, 3)] + CONTEXT[1:]
    assert qa_answer_positions(shifted, SEQUENCE_IDS, 0, "bob") == [6, 7]


def test_retrieved_ndcg_is_sklearns_ndcg_score_with_ties():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(2, 12)
        labels = [float(rng.random() < 0.4) for _ in range(n)]
        scores = [rng.choice([0.1, 0.2, 0.3, 0.5, 0.7]) if rng.random() < 0.5 else rng.random() for _ in range(n)]
        assert retrieved_ndcg(labels, scores) == pytest.approx(
            sklearn_metrics.ndcg_score([labels], [scores]), rel=1e-12, abs=1e-15), (labels, scores)
    assert retrieved_ndcg([0, 0, 0], [0.3, 0.2, 0.1]) == 0.0  # no relevant document retrieved
    with pytest.raises(ValueError, match="at least 2"):
        retrieved_ndcg([1.0], [0.5])


def test_retrieved_ndcg_reproduces_released_trec_dl_scores():
    # results/1b-clm-42k/IR/msmarco/msmarco_pairs_lr1e-04_sd0/results.json, test scores_i (TREC-DL 2019 queries)
    released = {0.9937947856332161: (0, 1, 2, 3, 4, 5, 6, 8, 9), 0.9842184869190971: (0, 1, 2, 3, 4, 6, 7, 8, 9),
                0.47902629279282405: (3, 8, 9)}
    for value, relevant_ranks in released.items():
        labels = [float(rank in relevant_ranks) for rank in range(10)]
        assert retrieved_ndcg(labels, [10.0 - rank for rank in range(10)]) == pytest.approx(value, rel=1e-12)
    # the standard nDCG@10 of a query with 10 relevant documents and nine of them retrieved is at most this:
    discounts = [1 / math.log2(rank + 2) for rank in range(10)]
    assert sum(discounts[:9]) / sum(discounts) < 0.937 < 0.9937947856332161


def test_retrieval_score_ranks_the_ten_most_similar_and_normalises_by_them():
    # query 0: 12 relevant documents (TREC-DL-like), 9 of them among its 10 most similar; query 1: one relevant
    # document (MLDR-like), at rank 3
    rng = np.random.default_rng(0)
    similarities = rng.random((2, 30)).astype(np.float32)
    order = np.argsort(-similarities, axis=1)
    relevant = [set(order[0, [0, 1, 2, 3, 4, 5, 6, 8, 9]]) | set(order[0, [20, 21, 22]]), {int(order[1, 2])}]
    assert sorted(top_k_retrieved(similarities)[0]) == sorted(order[0, :10])
    encodeval = retrieval_score(similarities, relevant)
    assert encodeval == pytest.approx((0.9937947856332161 + 0.5) / 2, rel=1e-9)
    rankings = [[str(d) for d in order[q, :10]] for q in range(2)]
    standard = ndcg_at_k(rankings, [{str(d) for d in r} for r in relevant])
    assert standard < encodeval  # the standard ideal counts the three relevant documents never retrieved
    one = retrieval_score(similarities[1:], relevant[1:])
    assert one == ndcg_at_k(rankings[1:], [{str(d) for d in relevant[1]}]) == pytest.approx(0.5)  # equal there


def test_retrieved_ndcg_of_nan_similarities_is_nan_without_a_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "Mean of empty slice" would raise here
        assert math.isnan(retrieved_ndcg([1.0, 0.0, 1.0], [float("nan")] * 3))
        assert math.isnan(retrieved_ndcg([1.0, 0.0], [0.5, float("nan")]))
        assert retrieved_ndcg([0.0, 0.0], [float("nan")] * 2) == 0.0  # nothing relevant: 0, as before
