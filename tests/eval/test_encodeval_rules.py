"""The paper suite run under EncodEval's rules (issue 45): its inputs (encodeval_inputs.py), heads
(encodeval_heads.py), QA as token tagging (encodeval_qa.py), and each run reporting EncodEval's score as the main
metric with the standard one beside it. Each rule is read in rimads/avey-b EncodEval/encodeval/ at 810ad06 (the
stored hgissbkh/EncodEval@MLM_vs_CLM lacks those files); every test fails on the code before them (no such modules,
or BOS-first inputs and EuroBERT's heads)."""
import importlib
import json
import shutil
from dataclasses import replace

import pytest
import torch
from eval_fixtures import WORDS, save_tiny_model
from transformers.modeling_outputs import TokenClassifierOutput

from mlmclm.eval.finetune.classification import encode_rows
from mlmclm.eval.finetune.encodeval_heads import (EncodEvalRetrievalEncoder, EncodEvalSequenceClassifier,
                                                  EncodEvalTokenClassifier)
from mlmclm.eval.finetune.encodeval_inputs import (encodeval_tokenizer, retrieval_eval_inputs, retrieval_lengths,
                                                   text_inputs)
from mlmclm.eval.finetune.encodeval_qa import EVAL_BATCH_SIZE, encode_questions, predicted_inside
from mlmclm.eval.finetune.heads import SpanQAModel
from mlmclm.eval.finetune.presets import paper_task
from mlmclm.eval.finetune.protocol import ProtocolConfig
from mlmclm.eval.finetune.runner import finetune_and_score
from mlmclm.eval.finetune.task_loading import load_task
from mlmclm.eval.finetune.token_classification import IGNORE, encode_words
from mlmclm.eval.finetune.training import pad_batch
from tools.evaluate import main as evaluate


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"), words=WORDS + ["Question", ":", "Context", "\n"])


def _variant(model_dir, tmp_path, **config):
    """A copy of the tiny model whose config.json carries extra fields (pooling, dropout)."""
    target = tmp_path / "variant"
    shutil.copytree(model_dir, target)
    raw = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**raw, **config}))
    return target


def test_sc_tc_and_ir_training_inputs_are_text_plus_eos_without_bos(model_dir, paper_root):
    # SC.py / TC.py / IR.py tokenize: tokenizer([t + eos_token], truncation=True, add_special_tokens=False)
    tokenizer = encodeval_tokenizer(model_dir)
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    sst2 = load_task(paper_task("sst2", paper_root))
    row = sst2["test"][0]
    [feature] = encode_rows(tokenizer, sst2.spec, [row], {label: label for label in sst2.labels}, 64)
    assert feature["input_ids"] == tokenizer(row["text"] + "<|end_of_text|>", add_special_tokens=False)["input_ids"]
    assert feature["input_ids"][0] != bos and feature["input_ids"][-1] == eos
    assert tokenizer(row["text"])["input_ids"][0] == bos  # what the standard path feeds: BOS first
    # cut at max_length, the EOS goes first, as EncodEval's truncation=True cuts it
    plain = tokenizer("alice is red", add_special_tokens=False)["input_ids"]
    assert text_inputs(tokenizer, ["alice is red"], 3)["input_ids"] == [plain]

    rows = [{"tokens": ["alice", "lives", "in", "paris"], "tags": ["B-PER", "O", "O", "B-LOC"]}]
    ids = {"O": 0, "B-PER": 1, "B-LOC": 2}
    [words] = encode_words(tokenizer, rows, ids, 64, "every", encodeval=True)
    assert words["input_ids"] == tokenizer("alice lives in paris<|end_of_text|>", add_special_tokens=False)[
        "input_ids"]
    assert words["labels"] == [1, 0, 0, 2, IGNORE]  # no BOS; the EOS belongs to no word
    [standard] = encode_words(tokenizer, rows, ids, 64, "every")
    assert standard["labels"] == [IGNORE, 1, 0, 0, 2, IGNORE]  # the standard path: BOS ... EOS


def test_qa_input_is_question_then_context_plus_eos_and_labels_tag_the_first_answer(model_dir):
    # QA.py tokenize: ("Question: {q}\nContext: ", context + eos), add_special_tokens=False, truncation only_second
    tokenizer = encodeval_tokenizer(model_dir)
    row = {"question": "where does bob live ?", "context": "alice lives in rome . bob lives in paris .",
           "answers": {"text": ["paris", "paris ."], "answer_start": [35, 35]}}
    [feature] = encode_questions(tokenizer, [row], 64)
    expected = tokenizer("Question: where does bob live ?\nContext: ", row["context"] + "<|end_of_text|>",
                         add_special_tokens=False)["input_ids"]
    assert feature["input_ids"] == expected and tokenizer.bos_token_id not in expected
    inside = [p for p, label in enumerate(feature["labels"]) if label == 1]
    assert tokenizer.convert_ids_to_tokens([feature["input_ids"][p] for p in inside]) == ["paris"]  # first answer
    [cut] = encode_questions(tokenizer, [row], len(expected) - 4)  # the context cut before the answer: no windows
    assert set(cut["labels"]) == {0}
    [unanswerable] = encode_questions(tokenizer, [{**row, "answers": {"text": [], "answer_start": []}}], 64)
    assert set(unanswerable["labels"]) == {0}


def test_retrieval_evaluates_through_sentence_transformers_tokenization(model_dir):
    # IR.py evaluates with SentenceTransformer.encode: models/Transformer.py tokenize strips each text and uses the
    # tokenizer's own template (BOS ... EOS here), cut at min(max_position_embeddings, model_max_length)
    tokenizer = encodeval_tokenizer(model_dir)
    encoded = retrieval_eval_inputs(tokenizer, ["  alice is red ", "bob"], 16)
    assert encoded["input_ids"][0].tolist() == tokenizer("alice is red")["input_ids"]
    assert encoded["attention_mask"][1].tolist() == [1, 1, 1, 0, 0]  # padded
    assert retrieval_lengths(tokenizer, model_dir) == (round(0.99 * min(512, tokenizer.model_max_length)),
                                                       min(512, tokenizer.model_max_length))


def test_sequence_head_is_pool_dense_gelu_classifier(model_dir, tmp_path):
    # modeling_sl_model.py SLModelForSequenceClassification: classifier_pooling "mean" | "eos", dense, GELU,
    # classifier; SLPreTrainedModel._init_weights: N(0, initializer_range), zero biases
    torch.manual_seed(0)
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 3, 3]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    cases = (("mean", {}), ("mean", {"classifier_pooling": "late"}), ("eos", {"classifier_pooling": "eos"}))
    for index, (pooling, config) in enumerate(cases):
        head = EncodEvalSequenceClassifier(_variant(model_dir, tmp_path / str(index), **config), 3)
        assert head.pooling == pooling
        hidden = head.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        pooled = ((hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True) if pooling == "mean"
                  else hidden[[0, 1], [3, 1]])
        expected = head.classifier(torch.nn.functional.gelu(head.dense(pooled)))
        out = head(ids, mask, labels=torch.tensor([0, 2]))
        assert torch.allclose(out.logits, expected, atol=1e-6)
        assert torch.isclose(out.loss, torch.nn.functional.cross_entropy(expected, torch.tensor([0, 2])))
    assert head.dense.bias.abs().sum() == 0 and abs(head.dense.weight.std().item() - 0.02) < 0.005


def test_token_head_is_dropout_then_linear_and_retrieval_pools_by_the_eos_switch(model_dir, tmp_path):
    # SLModelForTokenClassification: dropout(classifier_dropout or hidden_dropout or 0.1), then score; abstract_eval.py:
    # retrieval_pooling == "eos" -> sentence-transformers' last-token pooling, else mean
    assert EncodEvalTokenClassifier(model_dir, 2).dropout.p == 0.1
    assert EncodEvalTokenClassifier(_variant(model_dir, tmp_path / "d", classifier_dropout=0.3), 2).dropout.p == 0.3
    head = EncodEvalTokenClassifier(model_dir, 2).eval()
    ids, mask = torch.tensor([[5, 6, 3]]), torch.tensor([[1, 1, 0]])
    out = head(ids, mask, labels=torch.tensor([[1, 0, -100]]))
    hidden = head.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(out.logits, head.score(hidden), atol=1e-6)
    assert torch.isclose(out.loss, torch.nn.functional.cross_entropy(out.logits[0, :2], torch.tensor([1, 0])))
    mean, eos = EncodEvalRetrievalEncoder(model_dir), EncodEvalRetrievalEncoder(
        _variant(model_dir, tmp_path / "e", retrieval_pooling="eos"))
    assert (mean.pooling, eos.pooling) == ("mean", "eos")
    hidden = eos.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.allclose(eos(ids, mask), hidden[:, 1], atol=1e-6)  # the last real token, not the padding


@pytest.mark.parametrize("family, task, heads", [
    ("classification", "sst2", [EncodEvalSequenceClassifier]),
    ("token_classification", "conll2003", [EncodEvalTokenClassifier]),
    ("qa", "squad_v2", [EncodEvalTokenClassifier, SpanQAModel]),  # the tagger, then the standard span model
    ("retrieval", "msmarco", [EncodEvalRetrievalEncoder])])
def test_paper_runs_train_encodevals_heads_and_report_both_scores(family, task, heads, model_dir, paper_root,
                                                                 monkeypatch):
    modules = [importlib.import_module(f"mlmclm.eval.finetune.{name}") for name in
               ({"qa": ("encodeval_qa", "qa")}.get(family, (family,)))]
    seen = []
    for module in modules:
        real = module.train
        monkeypatch.setattr(module, "train", lambda model, *a, _real=real, **k: seen.append(type(model)) or
                            _real(model, *a, **k))
    data = load_task(paper_task(task, paper_root))
    config = replace(ProtocolConfig.paper(batch_size=8).finetune_config(1e-3, 0, family, task), max_steps=1,
                     max_epochs=None)
    outcome = finetune_and_score(model_dir, data, config)
    assert seen == heads
    expected = {"classification": {"accuracy"}, "token_classification": {"sentence_macro_f1", "entity_f1"},
                "qa": {"encodeval_f1", "f1", "exact_match"},
                "retrieval": {"encodeval_ndcg@10", "ndcg@10", "queries", "corpus"}}[family]
    assert set(outcome.metrics["test"]) == expected
    assert data.spec.main_metric in expected and data.spec.rules == "encodeval"


class _TagsPadding(torch.nn.Module):
    """A stand-in tagger that tags inside exactly the padding positions (input id = pad), to show which positions
    EncodEval's QA score reads."""

    def __init__(self, pad_id):
        super().__init__()
        self.pad_id = pad_id

    def forward(self, input_ids, attention_mask):
        return TokenClassifierOutput(logits=torch.stack([(input_ids != self.pad_id).float(),
                                                         (input_ids == self.pad_id).float()], dim=-1))


def test_qa_predictions_at_padding_positions_count_as_encodeval_reads_its_batches_of_4(model_dir):
    # QA.py evaluate: argmax over every position of each padded batch (per_device_eval_batch_size 4,
    # configs/QA/*.yaml); sanitize_predictions_labels keeps every position predicted 1, padding included
    tokenizer = encodeval_tokenizer(model_dir)
    rows = [{"question": "where does bob live ?", "context": "bob lives in rome ." + " the cat sat ." * extra,
             "answers": {"text": ["rome"], "answer_start": [13]}} for extra in (0, 3, 0, 0, 5)]
    features = encode_questions(tokenizer, rows, 128)
    pads = {"input_ids": tokenizer.pad_token_id, "attention_mask": 0, "labels": -100}
    predicted = predicted_inside(_TagsPadding(tokenizer.pad_token_id), features,
                                 lambda chunk: pad_batch(chunk, pads))
    assert EVAL_BATCH_SIZE == 4
    lengths = [len(f["input_ids"]) for f in features]
    first_batch = max(lengths[:4])  # questions 0-3 are padded to the longest of them; question 4 is alone
    assert predicted[0] == set(range(lengths[0], first_batch)) and predicted[1] == set()
    assert predicted[4] == set()


def test_paper_grid_prints_encodevals_score_and_the_standard_one(model_dir, paper_root, tmp_path, capsys):
    out = tmp_path / "out"
    rc = evaluate(["grid", "--model", f"tiny={model_dir}", "--data-root", str(paper_root), "--task", "squad_v2",
                   "--task", "msmarco", "--lrs", "1e-3", "--seeds", "0", "--max-steps", "1", "--batch-size", "8",
                   "--output", str(out)])
    console = capsys.readouterr().out
    assert rc == 0
    assert "| standard metric | standard test |" in console
    assert "| squad_v2 | encodeval_f1 |" in console and "| mldr_en | encodeval_ndcg@10 |" in console
    line = next(x for x in console.splitlines() if "| squad_v2 |" in x)
    assert "| f1 |" in line
    record = json.loads((out / "runs" / "tiny" / "nq" / "lr0.001_seed0.json").read_text())
    assert record["main_metric"] == "encodeval_ndcg@10" and "ndcg@10" in record["test"]
    assert record["extra"]["rules"] == "encodeval"


def test_rules_are_checked_where_the_task_is_declared(tmp_path):
    from mlmclm.eval.finetune.task_spec import TaskSpec

    with pytest.raises(ValueError, match="rules must be one of"):
        TaskSpec(name="t", family="qa", path=str(tmp_path), rules="paper")
    with pytest.raises(ValueError, match="'encodeval_f1' is computed under rules 'encodeval' only"):
        TaskSpec(name="t", family="qa", path=str(tmp_path), metric="encodeval_f1")
    with pytest.raises(ValueError, match="needs token_labels 'every'"):
        TaskSpec(name="t", family="token_classification", path=str(tmp_path), rules="encodeval")
    assert {paper_task(t).rules for t in ("sst2", "conll2003", "squad", "msmarco")} == {"encodeval"}
