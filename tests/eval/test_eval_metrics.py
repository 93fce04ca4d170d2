import math

import pytest

from mlmclm.eval.finetune.metrics import accuracy, entity_f1, mean_ci95, ndcg_at_k, normalize_answer, squad_scores


def test_accuracy_counts_matches():
    assert accuracy([1, 0, 2, 2], [1, 1, 2, 0]) == pytest.approx(0.5)


def test_entity_f1_partial_span_is_not_a_match():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG"]]
    pred = [["B-PER", "O", "O", "B-LOC"], ["B-ORG"]]
    # gold spans: PER[0:2], LOC[3], ORG[0]; predicted: PER[0:1] (partial: wrong), LOC[3], ORG[0]
    # precision 2/3, recall 2/3 -> F1 2/3
    assert entity_f1(gold, pred) == pytest.approx(2 / 3)


def test_entity_f1_wrong_type_and_length_mismatch():
    assert entity_f1([["B-PER", "I-PER"]], [["B-LOC", "I-LOC"]]) == 0.0
    with pytest.raises(ValueError, match="sequence 0"):
        entity_f1([["O", "O"]], [["O"]])


def test_squad_normalisation_and_scores():
    assert normalize_answer("  The  Cat!! ") == "cat"
    scores = squad_scores(
        ["The Cat!", "black cat", "", "something"],
        [["cat"], ["the cat sat"], [], []],
    )
    # EM: 1, 0, 1 (empty = unanswerable), 0 -> 0.5; F1: 1, 0.5 (P 1/2, R 1/2), 1, 0 -> 0.625
    assert scores["exact_match"] == pytest.approx(0.5)
    assert scores["f1"] == pytest.approx(0.625)


def test_squad_takes_best_gold_answer():
    assert squad_scores(["Paris"], [["London", "paris"]])["exact_match"] == pytest.approx(1.0)


def test_ndcg_at_10_on_known_ranking():
    ranking = [["d3", "d1", "d2"]]
    expected = (1 / math.log2(3) + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    assert ndcg_at_k(ranking, [{"d1", "d2"}]) == pytest.approx(expected)
    # a relevant document below rank 10 earns nothing
    deep = [[f"x{i}" for i in range(10)] + ["d1"]]
    assert ndcg_at_k(deep, [{"d1"}]) == 0.0
    assert ndcg_at_k([["d1"]], [{"d1"}]) == pytest.approx(1.0)


def test_mean_ci95_known_numbers():
    mean, half = mean_ci95([1, 2, 3, 4, 5])
    # t(0.975, 4) = 2.7764451, sd = sqrt(2.5)
    assert mean == pytest.approx(3.0)
    assert half == pytest.approx(2.7764451 * math.sqrt(2.5) / math.sqrt(5), rel=1e-6)
    single_mean, single_half = mean_ci95([0.7])
    assert single_mean == pytest.approx(0.7) and math.isnan(single_half)
