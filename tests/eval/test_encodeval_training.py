"""EncodEval's fine-tuning loop as transformers' Trainer 4.55 / sentence-transformers 3.4.1 / accelerate 1.9.0 run it
(issue 54): a step's loss is the mean of its micro-batches' token means, bf16 with fp32 losses, the libraries' data
order, torch's non-fused AdamW, a non-finite run kept stepping and scored, evaluation batches of 4."""
import copy
import math
import random
from dataclasses import replace

import pytest
import torch
from eval_fixtures import CITIES, FILLER, NAMES, make_task_folder, save_tiny_model

from mlmclm.eval.finetune.encodeval_heads import (EncodEvalRetrievalEncoder, EncodEvalSequenceClassifier,
                                                  EncodEvalTokenClassifier)
from mlmclm.eval.finetune.encodeval_inputs import encodeval_tokenizer, text_inputs
from mlmclm.eval.finetune.encodeval_qa import encode_questions
from mlmclm.eval.finetune.protocol import ProtocolConfig
from mlmclm.eval.finetune.runner import finetune_and_score
from mlmclm.eval.finetune.task_loading import load_task
from mlmclm.eval.finetune.task_spec import TaskSpec
from mlmclm.eval.finetune.token_classification import IGNORE, encode_words
from mlmclm.eval.finetune.training import FinetuneConfig, make_optimizer, pad_batch, train

WORDS = NAMES + CITIES + FILLER + ["Question", ":", "Context", "\n"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"), words=WORDS)


def _features(family, tokenizer, n=40, seed=0):
    """`n` training features of EncodEval's TC or QA inputs whose labelled-token counts differ from row to row."""
    rng = random.Random(seed)
    if family == "token_classification":
        rows = []
        for _ in range(n):
            words = [rng.choice(NAMES + FILLER[:10]) for _ in range(rng.randint(1, 12))]
            rows.append({"tokens": words, "tags": ["B-PER" if w in NAMES else "O" for w in words]})
        return encode_words(tokenizer, rows, {"O": 0, "B-PER": 1}, 64, "every", encodeval=True)
    rows = []
    for i in range(n):
        name, city = rng.choice(NAMES), rng.choice(CITIES)
        filler = " ".join(rng.choice(FILLER[:10]) for _ in range(rng.randint(0, 14)))
        context = f"{filler} {name} lives in {city} ."
        rows.append({"question": f"where does {name} live ?", "context": context,
                     "answers": {"text": [city], "answer_start": [context.index(f"in {city}") + 3]}})
    return encode_questions(tokenizer, rows, 64)


def _collate(tokenizer):
    pads = {"input_ids": tokenizer.pad_token_id, "attention_mask": 0, "labels": IGNORE}
    return lambda feats: pad_batch([{k: v for k, v in f.items() if not k.startswith("_")} for f in feats], pads)


def _token_mean(model, batch):
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch["labels"].flatten(), ignore_index=IGNORE)


@pytest.mark.parametrize("family", ["token_classification", "qa"])
def test_a_step_is_the_mean_of_its_eight_micro_batch_token_means(family, model_dir):
    # EncodEval configs/{TC,QA}/*.yaml: per_device_train_batch_size 4, train_batch_size 32 -> 8 accumulated
    # micro-batches; the SL model's forward takes no **kwargs, so transformers 4.55 Trainer.training_step divides
    # each micro-batch's token-mean loss by the accumulation steps: a step = the mean of 8 micro-batch means
    from mlmclm.eval.finetune.training import accumulate_step, trainer_forward

    tokenizer = encodeval_tokenizer(model_dir)
    torch.manual_seed(0)
    model = EncodEvalTokenClassifier(model_dir, num_labels=2)
    model.dropout.p = 0.0  # the same numbers in the reference passes below
    features, collate = _features(family, tokenizer), _collate(tokenizer)
    config = ProtocolConfig.paper(dtype="float32").finetune_config(1e-9, 3, family)
    assert (config.batch_size, config.micro_batch_size) == (32, 4)
    initial = copy.deepcopy(model)

    log = train(model, features, collate, lambda m, b: m(**b).loss, replace(config, max_steps=1, max_epochs=None))
    rows = [features[i] for i in torch.randperm(len(features), generator=torch.Generator().manual_seed(3))[:32]]
    with torch.no_grad():
        micro = [_token_mean(initial, collate(rows[i:i + 4])) for i in range(0, 32, 4)]
        whole = _token_mean(initial, collate(rows))
    expected = float(torch.stack(micro).mean())
    assert log.losses[0] == pytest.approx(expected, rel=1e-6)
    assert abs(float(whole) - expected) > 1e-4  # one token mean over the 32 rows: another number (tolerance 1e-6)

    # the gradient too: that of the mean of the micro-batch means
    step = accumulate_step(trainer_forward(initial, config), rows, collate, lambda m, b: m(**b).loss, 4)
    reference = copy.deepcopy(initial)
    torch.stack([_token_mean(reference, collate(rows[i:i + 4])) for i in range(0, 32, 4)]).mean().backward()
    assert float(step) == pytest.approx(expected, rel=1e-6)
    for (name, ours), theirs in zip(initial.named_parameters(), reference.parameters()):
        assert torch.allclose(ours.grad, theirs.grad, rtol=1e-5, atol=1e-8), name


def test_the_losses_are_fp32_under_bf16_weights(model_dir, tmp_path, monkeypatch):
    # EncodEval trains the bf16 model under the Trainer's autocast: its SL head's cross entropy runs in fp32 and
    # sentence-transformers' CachedMNRL gets fp32 embeddings (accelerate's convert_outputs_to_fp32) and computes
    # the normalisation, the similarities and the cross entropy in fp32, outside autocast
    seen = []
    real = torch.nn.functional.cross_entropy

    def recording(logits, *args, **kwargs):
        seen.append(logits.dtype)
        return real(logits, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", recording)
    for family in ("classification", "retrieval"):
        data = load_task(TaskSpec(name="t", family=family, rules="encodeval", path=str(
            make_task_folder(tmp_path / family, family, sizes=(16, 8, 8)))))
        config = ProtocolConfig.paper(batch_size=8).finetune_config(1e-4, 0, family)
        seen.clear()
        finetune_and_score(model_dir, data, replace(config, max_steps=2, max_epochs=None))
        assert config.dtype == "bfloat16" and seen and set(seen) == {torch.float32}, family


def test_retrieval_gradient_is_within_1e3_of_fp64(model_dir):
    # the bf16 tower's embeddings, as the Trainer hands them to the loss; the gradient the loss sends back to
    # them, against the same loss in fp64 from the same values. In bf16 (the loss computed in the tower's
    # precision, as before issue 54) it is about 2 % off
    from mlmclm.eval.finetune.retrieval import contrastive_loss
    from mlmclm.eval.finetune.training import trainer_forward

    tokenizer = encodeval_tokenizer(model_dir)
    torch.manual_seed(0)
    tower = EncodEvalRetrievalEncoder(model_dir).to(torch.bfloat16)
    rng = random.Random(0)
    queries = [f"color of {rng.choice(NAMES)} {rng.choice(FILLER[:10])}" for _ in range(32)]
    passages = [f"{q.split()[2]} is {rng.choice(['red', 'blue', 'green'])} {q.split()[3]}" for q in queries]
    forward = trainer_forward(tower, FinetuneConfig(learning_rate=1e-4, dtype="bfloat16"))

    def encoded(texts):
        enc = text_inputs(tokenizer, texts, 64)
        return pad_batch([{"input_ids": i, "attention_mask": m} for i, m in zip(enc["input_ids"],
                                                                              enc["attention_mask"])],
                         {"input_ids": tokenizer.pad_token_id, "attention_mask": 0})

    q, p = forward(**encoded(queries)), forward(**encoded(passages))
    assert q.dtype == torch.float32
    q.retain_grad()
    loss = contrastive_loss(q, p, normalise=True)
    loss.backward()

    def gradient(dtype):
        leaf = q.detach().to(dtype).requires_grad_()
        normalize = torch.nn.functional.normalize
        logits = normalize(leaf, dim=-1) @ normalize(p.detach().to(dtype), dim=-1).T / 0.05
        torch.nn.functional.cross_entropy(logits, torch.arange(32)).backward()
        return leaf.grad.double()

    exact = gradient(torch.float64)
    error = float((q.grad.double() - exact).norm() / exact.norm())
    assert 0.1 < float(loss.detach()) < 3 and error < 1e-3
    assert float((gradient(torch.bfloat16) - exact).norm() / exact.norm()) > 5e-3  # the bf16 loss is far off


@pytest.mark.parametrize("seed", range(5))
def test_the_data_order_is_the_trainers_and_sentence_transformers(seed):
    from mlmclm.eval.finetune import data_order

    n = 1000
    # transformers Trainer + accelerate 1.9 SeedableRandomSampler: epoch e = randperm(n, Generator seeded seed + e)
    trainer = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
    steps = data_order.step_rows(n, 32, seed, data_order.TRAINER)
    assert [i for _ in range(2) for i in next(steps)] == trainer[:64]
    second_epoch = data_order.epoch_orders(n, seed)
    next(second_epoch)
    assert next(second_epoch) == torch.randperm(n, generator=torch.Generator().manual_seed(seed + 1)).tolist()
    # sentence-transformers 3.4.1 get_train_dataloader: Generator(), seeded only `if args.seed`, one stream
    generator = torch.Generator()
    if seed:
        generator.manual_seed(seed)
    st = torch.randperm(n, generator=generator).tolist()
    steps = data_order.step_rows(n, 32, seed, data_order.SENTENCE_TRANSFORMERS)
    assert [i for _ in range(2) for i in next(steps)] == st[:64]
    st_epochs = data_order.epoch_orders(n, seed, data_order.SENTENCE_TRANSFORMERS)
    next(st_epochs)
    assert next(st_epochs) == torch.randperm(n, generator=generator).tolist()  # the same generator goes on


def test_training_reads_rows_in_that_order_and_the_epochs_last_batch_is_short(model_dir):
    seen = []

    def loss(forward, batch):
        seen.append(batch.tolist())
        return forward(batch).sum()

    features = torch.arange(70).float().reshape(70, 1)
    config = FinetuneConfig(learning_rate=1e-4, seed=2, max_steps=4, max_epochs=None, batch_size=32)
    train(torch.nn.Linear(1, 1), list(features), torch.stack, loss, config)
    epoch0 = torch.randperm(70, generator=torch.Generator().manual_seed(2)).tolist()
    epoch1 = torch.randperm(70, generator=torch.Generator().manual_seed(3)).tolist()
    assert [[int(r[0]) for r in batch] for batch in seen] == [epoch0[:32], epoch0[32:64], epoch0[64:], epoch1[:32]]


def test_adamw_is_torchs_default_implementation_not_the_fused_kernel():
    # transformers 4.55 under torch 2.7.1 defaults to optim "adamw_torch" (fused only from torch 2.8)
    optimizer = make_optimizer(torch.nn.Linear(2, 2), FinetuneConfig(learning_rate=1e-4))
    assert not optimizer.defaults["fused"] and optimizer.defaults["foreach"] is None


def test_a_run_whose_loss_goes_non_finite_is_scored_at_its_last_step_and_flagged(model_dir, tmp_path):
    # the Trainer keeps stepping through a NaN loss and EncodEval scores the model it ends with
    data = load_task(TaskSpec(name="t", family="classification", rules="encodeval", path=str(
        make_task_folder(tmp_path / "data", "classification", sizes=(32, 8, 8)))))
    config = replace(ProtocolConfig.paper(dtype="float32", batch_size=8).finetune_config(1e3, 0, "classification"),
                     max_steps=8, max_epochs=None)
    outcome = finetune_and_score(model_dir, data, config)
    losses = outcome.log.losses
    assert outcome.log.steps == len(losses) == 8 and outcome.log.diverged
    first_bad = next(i for i, value in enumerate(losses) if not math.isfinite(value))
    assert first_bad < 7  # it went on stepping after the first non-finite loss
    assert set(outcome.metrics) == {"validation", "test"}
    assert all(math.isfinite(split["accuracy"]) for split in outcome.metrics.values())


@pytest.mark.parametrize("family, head", [("classification", EncodEvalSequenceClassifier),
                                          ("token_classification", EncodEvalTokenClassifier),
                                          ("retrieval", EncodEvalRetrievalEncoder)])
def test_evaluation_batches_are_encodevals_4(family, head, model_dir, tmp_path, monkeypatch):
    sizes = []
    real = head.forward

    def recording(self, input_ids, attention_mask, *args, **kwargs):
        if not torch.is_grad_enabled():
            sizes.append(len(input_ids))
        return real(self, input_ids, attention_mask, *args, **kwargs)

    monkeypatch.setattr(head, "forward", recording)
    data = load_task(TaskSpec(name="t", family=family, rules="encodeval", path=str(
        make_task_folder(tmp_path / "data", family, sizes=(16, 10, 10))),
        token_labels="every" if family == "token_classification" else "first"))
    config = ProtocolConfig.paper(batch_size=8).finetune_config(1e-4, 0, family)
    finetune_and_score(model_dir, data, replace(config, max_steps=1, max_epochs=None))
    assert sizes and max(sizes) == 4 and sizes.count(4) >= len(sizes) - 4


def test_a_batch_that_is_not_whole_micro_batches_is_refused():
    from mlmclm.eval.finetune import data_order

    with pytest.raises(ValueError, match="multiple of micro_batch_size"):
        FinetuneConfig(learning_rate=1e-4, batch_size=10, micro_batch_size=4)
    with pytest.raises(ValueError, match="batch size 10 is not a whole number of classification micro-batches of 4"):
        ProtocolConfig.paper(batch_size=10)
    assert ProtocolConfig.paper(batch_size=2).finetune_config(1e-4, 0, "qa").micro_batch_size == 2
    assert ProtocolConfig.paper().finetune_config(1e-4, 0, "retrieval").micro_batch_size is None
    with pytest.raises(ValueError, match="unknown data order 'random'"):
        next(data_order.step_rows(4, 2, 0, "random"))


def test_the_retrieval_corpus_is_in_encodevals_first_judged_order():
    # encodeval/datasets.py msmarco() / mldr_en(): corpus_sub fills as the qrels (validation, then test) name each
    # document; IR.py encodes the corpus 4 documents at a time in that order
    from mlmclm.eval.data.retrieval_sets import beir_sets, mldr_sets

    def reader(ids):  # the shards' order: another one
        return {doc: f"text {doc}" for doc in sorted(ids)}

    qrels = {"validation": [("q1", "d9", 1), ("q1", "d3", 0), ("q2", "d5", 2)],
             "test": [("q3", "d1", 1), ("q3", "d9", 1), ("q4", "d7", 0)]}
    _, corpus = beir_sets(qrels, lambda ids: {q: q for q in ids}, reader)
    assert list(corpus) == ["d9", "d3", "d5", "d1", "d7"]
    judged = {"validation": [{"query_id": 1, "query": "a", "positive_passages": [{"docid": "m4"}, {"docid": "m2"}]}],
              "test": [{"query_id": 2, "query": "b", "positive_passages": [{"docid": "m3"}, {"docid": "m4"}]}]}
    _, corpus = mldr_sets(judged, reader)
    assert list(corpus) == ["m4", "m2", "m3"]
