"""Evaluation defects of issue 13 item 6, each pinned by a test: token classification that learns what it should
(words tokenized as running text, the smoke budget for `--smoke`), tags refused unless BIO, an empty split file
refused by name, strict JSON summaries, 1-based line numbers in every input error, one stability box per task."""
import importlib.util
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from eval_fixtures import make_task_folder, write_jsonl
from transformers import AutoTokenizer, EuroBertConfig, EuroBertForMaskedLM

from mlmclm.data.tokenizer import train_bpe
from mlmclm.eval.checks.smoke import SMOKE_BATCH_SIZE, SMOKE_LEARNING_RATES, SMOKE_MAX_STEPS
from mlmclm.eval.finetune.protocol import RunRecord
from mlmclm.eval.grid.run import run_grid
from mlmclm.eval.finetune.task_loading import load_task
from mlmclm.eval.finetune.task_spec import TaskDataError, TaskSpec
from mlmclm.eval.finetune.token_classification import IGNORE, encode_words, word_predictions
from mlmclm.eval.reports.compare import stability_boxes
from mlmclm.eval.reports.summary import task_results, write_summary

NAMES = ["Alice", "Bernard", "Cordelia", "Duncan", "Edmund", "Fabian", "Gertrude", "Horatio", "Iago", "Juliet"]
FILLER = "the a cat dog sat ran good bad film was very lives in where does live who is red blue green and of".split()


def _evaluate_cli():
    spec = importlib.util.spec_from_file_location("evaluate_cli", Path(__file__).resolve().parents[2] / "tools" /
                                                  "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _name_rows(n: int, rng: random.Random) -> list[dict]:
    """Lower-case filler words with capitalised names tagged B-PER: trivially learnable."""
    rows = []
    for _ in range(n):
        tokens = [rng.choice(NAMES) if rng.random() < 0.2 else rng.choice(FILLER) for _ in range(rng.randint(4, 10))]
        rows.append({"tokens": tokens, "tags": ["B-PER" if t[0].isupper() else "O" for t in tokens]})
    return rows


@pytest.fixture(scope="module")
def bpe_model_dir(tmp_path_factory) -> Path:
    """Random 2-layer EuroBERT with a small byte-level BPE (like the embedded tokenizer and EuroBERT's), trained
    on running text, so a word has one form after a space (`ĠAlice`) and another at the start of a text."""
    directory = tmp_path_factory.mktemp("bpe_eurobert")
    rng = random.Random(0)
    text = [" ".join(row["tokens"]) for row in _name_rows(400, rng)]
    train_bpe(text, vocab_size=400, out_dir=directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    torch.manual_seed(0)
    config = EuroBertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
                            pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                            eos_token_id=tokenizer.eos_token_id, mask_token_id=tokenizer.mask_token_id)
    EuroBertForMaskedLM(config).save_pretrained(directory)
    return directory


# --- (a) token classification learns a trivially learnable task --------------------------------------------------

def test_words_are_tokenized_as_in_running_text(bpe_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(bpe_model_dir)
    row = {"tokens": ["the", "dog", "of", "Duncan", "sat", "with", "Juliet"],
           "tags": ["O", "O", "O", "B-PER", "O", "O", "B-PER"]}
    running_text = tokenizer(" ".join(row["tokens"]))["input_ids"]
    assert "ĠDuncan" in tokenizer.convert_ids_to_tokens(running_text)  # the form pretraining sees
    feature = encode_words(tokenizer, [row], {"O": 0, "B-PER": 1}, max_length=64)[0]
    assert feature["input_ids"] == running_text
    labelled = [(tokenizer.convert_ids_to_tokens(i), label)
                for i, label in zip(feature["input_ids"], feature["labels"]) if label != IGNORE]
    assert [label for _, label in labelled] == [0, 0, 0, 1, 0, 0, 1]  # one label per word, on its first token
    assert labelled[3][0] == "ĠDuncan"


def test_a_word_without_tokens_does_not_shift_the_words_after_it(bpe_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(bpe_model_dir)
    row = {"tokens": ["Alice", "", "sat", "Iago"], "tags": ["B-PER", "O", "O", "B-PER"]}
    (feature,) = encode_words(tokenizer, [row], None, max_length=64)
    assert sorted(feature["_word_tokens"]) == [0, 2, 3]  # the empty word has no token
    predicted = [0] * len(feature["input_ids"])
    for word, [position] in feature["_word_tokens"].items():
        predicted[position] = 1 if row["tags"][word] == "B-PER" else 0
    assert word_predictions(feature, predicted, ["O", "B-PER"]) == row["tags"]


def test_cli_smoke_runs_take_the_smoke_budget():
    cli = _evaluate_cli()
    smoke = cli._protocol(cli.build_parser().parse_args(["grid", "--model", "m=x", "--smoke", "--output", "o"]))
    assert (smoke.learning_rates, smoke.max_steps, smoke.max_epochs, smoke.batch_size) == (
        SMOKE_LEARNING_RATES, SMOKE_MAX_STEPS, None, SMOKE_BATCH_SIZE)
    custom = cli._protocol(cli.build_parser().parse_args(["grid", "--model", "m=x", "--smoke", "--tasks", "t.json",
                                                          "--lrs", "1e-4", "--output", "o"]))
    assert (custom.learning_rates, custom.max_steps, custom.max_epochs, custom.batch_size) == ((1e-4,), 1000, 1, 32)


def test_trivially_learnable_ner_scores_well_under_the_cli_smoke_protocol(tmp_path, bpe_model_dir):
    """Smoke-NER sized (200 train rows): the paper grid with one epoch (7 steps) leaves it near entity F1 0; the
    smoke budget (100 steps) learns it (about 2 s on an idle CPU)."""
    rng = random.Random(1)
    for split, n in (("train", 200), ("validation", 48), ("test", 48)):
        write_jsonl(tmp_path / "names" / f"{split}.jsonl", _name_rows(n, rng))
    cli = _evaluate_cli()
    protocol = cli._protocol(cli.build_parser().parse_args(["grid", "--model", "m=x", "--smoke", "--seeds", "0",
                                                            "--output", "o"]))
    spec = TaskSpec(name="names", family="token_classification", path=str(tmp_path / "names"), max_length=32)
    records = run_grid({"bpe": bpe_model_dir}, [spec], tmp_path / "out", protocol, progress=False)
    (result,) = task_results(records)
    assert result.test_mean >= 0.8, (result, [(r.learning_rate, r.steps, r.test) for r in records])


# --- (b) only BIO tags, and only tags the model can learn --------------------------------------------------------

def _ner_folder(folder: Path, train_rows=None, test_rows=None) -> Path:
    make_task_folder(folder, "token_classification")
    if train_rows is not None:
        write_jsonl(folder / "train.jsonl", train_rows + _name_rows(8, random.Random(0)))
    if test_rows is not None:
        write_jsonl(folder / "test.jsonl", test_rows)
    return folder


@pytest.mark.parametrize("tag", ["PER", "b-per", "B_PER", "B-", "E-PER", "S-LOC"])
def test_non_bio_tags_are_refused_with_file_line_and_tag(tmp_path, tag):
    _ner_folder(tmp_path, train_rows=[{"tokens": ["alice", "sat"], "tags": ["O", "O"]},
                                      {"tokens": ["bob", "sat"], "tags": [tag, "O"]}])
    with pytest.raises(TaskDataError, match=rf"train\.jsonl:2: tag '{tag}' \(token 1\) is not a BIO"):
        load_task(TaskSpec(name="ner", family="token_classification", path=str(tmp_path)))


def test_inside_tag_without_its_begin_tag_is_refused(tmp_path):
    _ner_folder(tmp_path, train_rows=[{"tokens": ["new", "york"], "tags": ["I-LOC", "I-LOC"]}])
    with pytest.raises(TaskDataError, match=r"train\.jsonl:1: tag 'I-LOC' but train has no 'B-LOC'"):
        load_task(TaskSpec(name="ner", family="token_classification", path=str(tmp_path)))


def test_evaluation_tag_unseen_in_train_is_refused(tmp_path):
    _ner_folder(tmp_path, test_rows=[{"tokens": ["alice"], "tags": ["B-PER"]}, {"tokens": ["ibm"], "tags": ["B-ORG"]}])
    with pytest.raises(TaskDataError, match=r"test\.jsonl:2: tag 'B-ORG' \(test split\) never occurs"):
        load_task(TaskSpec(name="ner", family="token_classification", path=str(tmp_path)))


def test_cli_refuses_a_bad_tag_with_exit_2_before_training(tmp_path, tiny_model_dir, capsys):
    folder = _ner_folder(tmp_path / "ner", train_rows=[{"tokens": ["alice"], "tags": ["PER"]}])
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([{"name": "ner", "family": "token_classification", "path": str(folder)}]))
    code = _evaluate_cli().main(["grid", "--model", f"tiny={tiny_model_dir}", "--tasks", str(tasks), "--lrs", "1e-3",
                                 "--seeds", "0", "--output", str(tmp_path / "out")])
    assert code == 2
    assert f"{folder / 'train.jsonl'}:1: tag 'PER'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before any run


# --- (c) an empty split file is an error; only a missing one is derived ------------------------------------------

def test_empty_test_file_is_named_and_a_missing_one_is_derived(tmp_path):
    make_task_folder(tmp_path, "classification")
    (tmp_path / "test.jsonl").write_text("\n")
    with pytest.raises(TaskDataError, match=rf"{tmp_path / 'test.jsonl'} is empty"):
        load_task(TaskSpec(name="cls", family="classification", path=str(tmp_path)))
    (tmp_path / "test.jsonl").unlink()
    data = load_task(TaskSpec(name="cls", family="classification", path=str(tmp_path)))
    assert "two halves of the labeled validation split" in data.notes[0]


# --- (d) summary.json is strict JSON -------------------------------------------------------------------------------

def _record(task="cls", seed=0, lr=1e-3, score=0.5, model="m"):
    return RunRecord(model=model, task=task, family="classification", main_metric="accuracy", learning_rate=lr,
                     seed=seed, validation={"accuracy": score}, test={"accuracy": score}, diverged=False, steps=5,
                     train_loss_first=1.0, train_loss_last=0.5, fingerprint="x")


def _reject_constant(name):
    raise ValueError(f"not JSON: {name}")


def test_one_seed_summary_is_strict_json_with_null_ci(tmp_path):
    write_summary([_record()], tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text(), parse_constant=_reject_constant)
    assert summary["tasks"][0]["test_ci95"] is None and summary["families"][0]["test_ci95"] is None
    assert summary["tasks"][0]["test_mean"] == 0.5


def test_non_finite_scores_become_null_in_the_summary(tmp_path):
    write_summary([_record(score=float("nan")), _record(seed=1, score=float("inf"))], tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text(), parse_constant=_reject_constant)
    assert summary["tasks"][0]["test_scores"] == [None, None]


# --- (e) every input error counts lines from 1 -----------------------------------------------------------------------

def test_field_errors_give_the_1_based_line_like_json_errors(tmp_path):
    lines = ['{"text": "a", "label": "x"}', "", '{"text": "b", "label": "y"}', '{"txt": "c", "label": "x"}']
    (tmp_path / "train.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(TaskDataError, match=rf"{tmp_path / 'train.jsonl'}:4: missing field 'text'"):
        load_task(TaskSpec(name="cls", family="classification", path=str(tmp_path)))
    (tmp_path / "train.jsonl").write_text("\n".join(lines[:3] + ["{oops"]) + "\n")
    with pytest.raises(TaskDataError, match=rf"{tmp_path / 'train.jsonl'}:4: invalid JSON"):
        load_task(TaskSpec(name="cls", family="classification", path=str(tmp_path)))


def test_parquet_rows_are_counted_from_1(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"text": "a", "label": 1}, {"text": None, "label": 2}]),
                   tmp_path / "train.parquet")
    with pytest.raises(TaskDataError, match=r"train\.parquet row 2: missing field 'text'"):
        load_task(TaskSpec(name="cls", family="classification", path=str(tmp_path)))


# --- (f) the stability plot has one box per task -------------------------------------------------------------------

def test_stability_boxes_are_per_task_never_pooled():
    records = {"CLM": [_record("sst2", s, lr, 0.9) for s in (0, 1) for lr in (1e-4, 1e-3)]
                      + [_record("msmarco", s, 1e-4, 0.3) for s in (0, 1)],
               "MLM": [_record("sst2", 0, 1e-4, 0.8, "MLM")]}
    boxes = stability_boxes(records)
    assert [(b.task, b.label, len(b.scores)) for b in boxes] == [("msmarco", "CLM", 2), ("sst2", "CLM", 4),
                                                                 ("sst2", "MLM", 1)]
    assert all(score == pytest.approx(30.0) for score in boxes[0].scores)
