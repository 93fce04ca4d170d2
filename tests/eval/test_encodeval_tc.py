"""EncodEval's token-classification score, sentence by sentence, against a transcription of rimads/avey-b
EncodEval/encodeval/eval_tasks/TC.py at 810ad06 (issue 54): which word each token belongs to (its start offset:
a lone-space token goes to the next word) and the vote `max(set(preds), key=preds.count)` (ties in CPython's set
order), on random sentences with tag ids up to 36 and a byte-level BPE that emits lone-space tokens."""
import random
import warnings

import pytest
from transformers import AutoTokenizer

from mlmclm.data.tokenizer import train_bpe
from mlmclm.eval.finetune.encodeval_tc import encodeval_token_words, encodeval_vote, set_order
from mlmclm.eval.finetune.metrics import sentence_macro_f1
from mlmclm.eval.finetune.token_classification import encode_words, scored_words

TAGS = ["O"] + [f"{prefix}-T{i}" for i in range(18) for prefix in ("B", "I")]  # ids 0..36, as OntoNotes'


def test_set_order_is_the_iteration_order_of_this_interpreters_set():
    rng = random.Random(0)
    for _ in range(20_000):
        top = rng.choice([9, 37, 37, 64, 1000])
        values = [rng.randrange(top) for _ in range(rng.randint(1, 50))]
        assert set_order(values) == list(set(values)), values
    with pytest.raises(ValueError, match="non-negative ints"):
        set_order([1, -2])


def test_the_vote_breaks_ties_in_set_order_not_by_the_smaller_id():
    assert encodeval_vote([1, 8]) == 8  # 8 is slot 0 of the 8-slot table: CoNLL's I-MISC beats B-PER
    assert encodeval_vote([9, 1]) == 9 and encodeval_vote([1, 9]) == 1  # a collision: insertion order decides
    assert encodeval_vote([0, 2]) == 0 and encodeval_vote([36, 4]) == 36
    assert encodeval_vote([5, 8, 8, 5, 5]) == 5  # the most frequent wins whatever the order
    with pytest.raises(ValueError, match="without votes"):
        encodeval_vote([])


def test_a_token_belongs_to_the_word_its_start_offset_falls_in_or_precedes():
    words = ["ab", "cd", "e"]  # "ab cd e": ab = 0-1, the space 2 goes with cd (2-4), the space 5 with e (5-6)
    offsets = [(0, 0), (0, 2), (2, 3), (3, 5), (5, 7), (7, 22)]  # BOS, "ab", " " alone, "cd", " e", EOS
    assert encodeval_token_words(offsets, words) == [None, 0, 1, 1, 2, None]
    assert encodeval_token_words([(0, 1), (1, 2)], ["a"]) == [0, None]  # past the last word: none


def _reference_word_ids(offsets, words):
    """TC.py `tokenize`'s alignment, transcribed: special tokens (offsets (0, 0)) get -100; otherwise the scan
    steps past every word whose span plus its trailing space ends at or before the token's start; past the last
    word, -100."""
    out, index, position, current = [], 0, 0, words[0]
    for offset in offsets:
        if tuple(offset) == (0, 0):
            out.append(-100)
            continue
        while offset[0] >= position + len(current):
            position += len(current) + 1
            index += 1
            if index >= len(words):
                break
            current = words[index]
        out.append(index if index < len(words) else -100)
    return out


def _reference_score(predicted, word_ids, gold_ids, f1_score):
    """TC.py `get_token_predictions_labels` + `compute_f1s` for one sentence: per word with a token (sorted), the
    first-met maximum of its tokens' predictions over Python's set, then sklearn's macro F1."""
    true, pred = [], []
    for word in sorted(set(word_ids) - {-100}):
        votes = [p for p, w in zip(predicted, word_ids) if w == word]
        pred.append(max(set(votes), key=votes.count))
        true.append(gold_ids[word])
    return f1_score(true, pred, average="macro")


@pytest.fixture(scope="module")
def byte_level_tokenizer(tmp_path_factory):
    """Our byte-level BPE (mlmclm.data.tokenizer.train_bpe), trained on words that start with a lower-case letter;
    the sentences below also hold words that start otherwise, after which it has no merge for the space: a lone-
    space token."""
    rng = random.Random(1)
    letters = "abcdefghijklmnopqrstuvwxyz"
    trained = [rng.choice(letters) + "".join(rng.choice(letters + "0123456789") for _ in range(rng.randint(0, 6)))
               for _ in range(200)]
    folder = tmp_path_factory.mktemp("bpe")
    train_bpe([" ".join(rng.choice(trained) for _ in range(12)) for _ in range(300)], 400, folder)
    other = [rng.choice("0123456789ABCXYZ&-'(éøß") + word for word in trained[:60]]
    return AutoTokenizer.from_pretrained(folder), trained + other


def test_our_tc_score_is_encodevals_in_every_sentence(byte_level_tokenizer):
    f1_score = pytest.importorskip("sklearn.metrics").f1_score
    tokenizer, vocabulary = byte_level_tokenizer
    rng = random.Random(0)
    tag_ids = {tag: i for i, tag in enumerate(TAGS)}
    sentences = ties = set_order_ties = lone_spaces = cut = differs_before = 0
    for _ in range(400):
        words = [rng.choice(vocabulary) for _ in range(rng.randint(1, 14))]
        row = {"tokens": words, "tags": [rng.choice(TAGS) for _ in words]}
        max_length = rng.choice([8, 16, 512])  # some sentences lose their last words (and their EOS)
        [feature] = encode_words(tokenizer, [row], tag_ids, max_length, "every", encodeval=True)
        candidates = rng.sample(range(len(TAGS)), 3)  # few ids per sentence: many ties
        predicted = [rng.choice(candidates) for _ in feature["input_ids"]]
        encoded = tokenizer(" ".join(words) + tokenizer.eos_token, truncation=True, max_length=max_length,
                            add_special_tokens=False, return_offsets_mapping=True)
        word_ids = _reference_word_ids(encoded["offset_mapping"], words)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sklearn warns on tags predicted but absent (scored 0, as ours)
            reference = _reference_score(predicted, word_ids, [tag_ids[t] for t in row["tags"]], f1_score)
        gold, kept = scored_words(feature, predicted, row["tags"], TAGS, encodeval=True)
        assert sentence_macro_f1([gold], [kept]) == pytest.approx(reference, rel=1e-12, abs=1e-15), (words, predicted)
        # what the sentences hold: ties, ties the set order breaks otherwise than the smaller id, lone spaces
        sentences += 1
        cut += len(feature["input_ids"]) == max_length
        pieces = tokenizer.convert_ids_to_tokens(feature["input_ids"])
        lone_spaces += any(piece == "Ġ" and owner is not None for piece, owner in zip(
            pieces, encodeval_token_words(encoded["offset_mapping"], words)))
        for positions in feature["_word_tokens"].values():
            votes = [predicted[p] for p in positions]
            top = [v for v in set(votes) if votes.count(v) == max(map(votes.count, votes))]
            ties += len(top) > 1
            set_order_ties += len(top) > 1 and encodeval_vote(votes) != min(top)
        before_gold, before = scored_words(encode_words(tokenizer, [row], tag_ids, max_length, "every")[0], predicted,
                                           row["tags"], TAGS)
        differs_before += sentence_macro_f1([before_gold], [before]) != pytest.approx(reference)
    assert sentences == 400 and cut > 50 and lone_spaces > 50 and ties > 200 and set_order_ties > 50
    assert differs_before > 25  # the rules before issue 54 (spaces ignored, ties to the smaller id) scored otherwise
