"""Unit tests: resume fingerprint by file content, QA answer / no-answer selection, word alignment for token
classification."""
import numpy as np
import pytest
from eval_fixtures import make_task_folder, save_tiny_model
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from mlmclm.eval.finetune.protocol import ProtocolConfig, run_fingerprint, run_path
from mlmclm.eval.finetune.qa import MAX_ANSWER_TOKENS, _best_answers
from mlmclm.eval.finetune.task_spec import TaskSpec
from mlmclm.eval.finetune.token_classification import IGNORE, encode_words, word_predictions
from mlmclm.eval.finetune.training import FinetuneConfig
from mlmclm.eval.grid.run import run_grid

# --- resume fingerprint ------------------------------------------------------------------------------------------


def test_a_re_export_into_the_same_directory_is_not_reused(tmp_path):
    model = save_tiny_model(tmp_path / "model", seed=0)
    spec = TaskSpec(name="cls", family="classification", path=str(make_task_folder(tmp_path / "data",
                                                                                   "classification",
                                                                                   sizes=(16, 8, 8))),
                    max_length=32)
    config = FinetuneConfig(learning_rate=1e-3, max_steps=2, batch_size=8)
    weights = model / "model.safetensors"
    size, first = weights.stat().st_size, run_fingerprint(model, spec, config)

    save_tiny_model(model, seed=0)  # the same model written again: same content, new mtime
    assert run_fingerprint(model, spec, config) == first
    save_tiny_model(model, seed=1)  # other weights, same names and sizes
    assert weights.stat().st_size == size
    assert run_fingerprint(model, spec, config) != first

    # through the grid: the stale run is redone after the re-export
    out, protocol = tmp_path / "out", ProtocolConfig(learning_rates=(1e-3,), seeds=(0,), max_steps=2, batch_size=8)
    save_tiny_model(model, seed=0)
    run_grid({"m": model}, [spec], out, protocol, progress=False)
    path = run_path(out, "m", "cls", 1e-3, 0)
    stamp = path.stat().st_mtime_ns
    run_grid({"m": model}, [spec], out, protocol, progress=False)
    assert path.stat().st_mtime_ns == stamp  # unchanged model: reused
    save_tiny_model(model, seed=1)
    run_grid({"m": model}, [spec], out, protocol, progress=False)
    assert path.stat().st_mtime_ns != stamp  # re-exported model: re-run


# --- QA: best span and no-answer ---------------------------------------------------------------------------------

CONTEXT = "alice lives in rome"
# [BOS] where(question) [SEP] alice lives in rome [SEP]: question and special tokens have no context offsets
OFFSETS = [None, None, None, (0, 5), (6, 11), (12, 14), (15, 19), None]


def _logits(best: dict[int, float], size: int = len(OFFSETS)) -> np.ndarray:
    values = np.full(size, -10.0)
    for position, value in best.items():
        values[position] = value
    return values


def _answers(starts, ends, allow_no_answer, offsets=(OFFSETS,), examples=(0,)):
    rows = [{"context": CONTEXT}]
    features = [{"_example": e, "_offsets": list(o)} for e, o in zip(examples, offsets)]
    return _best_answers(rows, features, starts, ends, allow_no_answer)


def test_qa_best_valid_span_wins():
    assert _answers([_logits({6: 5.0})], [_logits({6: 5.0})], allow_no_answer=True) == ["rome"]
    # a multi-token span
    assert _answers([_logits({4: 5.0})], [_logits({6: 5.0})], allow_no_answer=False) == ["lives in rome"]


def test_qa_no_answer_only_when_allowed_and_the_null_score_beats_the_best_span():
    starts, ends = [_logits({0: 4.0, 6: 1.0})], [_logits({0: 4.0, 6: 1.0})]  # null 8 > span 2
    assert _answers(starts, ends, allow_no_answer=True) == [""]
    assert _answers(starts, ends, allow_no_answer=False) == ["rome"]  # SQuAD v1: always a span
    starts, ends = [_logits({0: 1.0, 6: 3.0})], [_logits({0: 1.0, 6: 3.0})]  # null 2 < span 6
    assert _answers(starts, ends, allow_no_answer=True) == ["rome"]


def test_qa_invalid_spans_are_skipped():
    # the best start/end sit on question tokens (no offsets) or end before start: the next valid span wins
    starts = [_logits({1: 9.0, 6: 8.0, 3: 2.0})]
    ends = [_logits({2: 9.0, 3: 8.0, 6: 1.0})]
    # skipped: 1..2 on question tokens (18), 6..3 reversed (16); valid: 3..3 "alice" (10) beats 6..6 "rome" (9)
    assert _answers(starts, ends, allow_no_answer=False) == ["alice"]
    long_offsets = [None] + [(i, i + 1) for i in range(MAX_ANSWER_TOKENS + 5)]
    rows = [{"context": "x" * (MAX_ANSWER_TOKENS + 5)}]
    starts, ends = [_logits({1: 9.0, 2: 1.0}, len(long_offsets))], [_logits({MAX_ANSWER_TOKENS + 4: 9.0, 2: 1.0},
                                                                            len(long_offsets))]
    features = [{"_example": 0, "_offsets": long_offsets}]
    # 1..MAX+4 (18) is longer than MAX_ANSWER_TOKENS: refused; 1..2 (10) is the best valid span
    assert _best_answers(rows, features, starts, ends, False) == ["xx"]


def test_qa_windows_of_one_example_compete_and_the_lowest_null_counts():
    window_a = [None, (0, 5), (6, 11), None]  # "alice lives"
    window_b = [None, (12, 14), (15, 19), None]  # "in rome"
    starts = [_logits({0: 3.0, 1: 2.0}, 4), _logits({0: -5.0, 2: 4.0}, 4)]
    ends = [_logits({0: 3.0, 1: 2.0}, 4), _logits({0: -5.0, 2: 4.0}, 4)]
    # best span: "rome" in window b (8); null = min over windows (-10) — so the answer is "rome", although
    # window a alone would say "no answer" (null 6 > span 4)
    assert _answers(starts, ends, True, offsets=(window_a, window_b), examples=(0, 0)) == ["rome"]


# --- token classification: word alignment ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def subword_tokenizer():
    vocab = {t: i for i, t in enumerate(["[CLS]", "[SEP]", "[PAD]", "[UNK]", "ali", "##ce", "lives", "in", "new",
                                         "##york", "bob"])}
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 0),
                                                                                               ("[SEP]", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
                                   unk_token="[UNK]")


LABELS = ["O", "B-LOC", "B-PER", "I-PER"]
TAG_IDS = {t: i for i, t in enumerate(LABELS)}


def test_only_the_first_sub_token_of_each_word_is_labelled(subword_tokenizer):
    rows = [{"tokens": ["alice", "lives", "in", "newyork"], "tags": ["B-PER", "O", "O", "B-LOC"]}]
    (feature,) = encode_words(subword_tokenizer, rows, TAG_IDS, max_length=32)
    pieces = subword_tokenizer.convert_ids_to_tokens(feature["input_ids"])
    assert pieces == ["[CLS]", "ali", "##ce", "lives", "in", "new", "##york", "[SEP]"]
    assert feature["_word_tokens"] == {0: [1], 1: [3], 2: [4], 3: [5]}
    assert feature["labels"] == [IGNORE, TAG_IDS["B-PER"], IGNORE, 0, 0, TAG_IDS["B-LOC"], IGNORE, IGNORE]


def test_predictions_map_back_one_per_word_from_the_first_sub_token(subword_tokenizer):
    rows = [{"tokens": ["alice", "lives", "in", "newyork"], "tags": ["B-PER", "O", "O", "B-LOC"]}]
    (feature,) = encode_words(subword_tokenizer, rows, None, max_length=32)
    # the second sub-tokens predict something else: ignored
    predicted = [0, TAG_IDS["B-PER"], TAG_IDS["I-PER"], 0, 0, TAG_IDS["B-LOC"], TAG_IDS["B-PER"], 0]
    assert word_predictions(feature, predicted, LABELS) == ["B-PER", "O", "O", "B-LOC"]


def test_truncated_words_are_predicted_outside(subword_tokenizer):
    rows = [{"tokens": ["bob", "lives", "in", "newyork"], "tags": ["B-PER", "O", "O", "B-LOC"]}]
    (feature,) = encode_words(subword_tokenizer, rows, TAG_IDS, max_length=4)  # [CLS] bob lives [SEP]
    assert feature["_word_tokens"] == {0: [1], 1: [2]}
    assert word_predictions(feature, [0, 2, 0, 0], LABELS) == ["B-PER", "O", "O", "O"]
