"""Retrieval: mean-pooled bi-encoder (shared tower) trained with InfoNCE over in-batch negatives at temperature
0.05, scored by binary NDCG@10. The corpus: an id-keyed set (the paper's, retrieval_sets.py) ranks against its own
corpus (documents by id, relevance by id); otherwise, with the "official" / "seeded_halves" split protocols, the
passages of both the validation and the test rows, else each split's own passages. Queries and passages get the task's prefixes ("Query: " / "Document: " in the
paper); the same fine-tuned model also scores the task's `extra_tests` (the paper trains once on MS MARCO and
tests on MS MARCO, NQ and MLDR-en) on their own validation and test splits, reported as `validation:<name>` /
`test:<name>` with the query and corpus counts. Under EncodEval's rules: its pooling (encodeval_heads.py), its
training and evaluation inputs (encodeval_inputs.py), and its score (`encodeval_ndcg@10`, encodeval_scores.py)
beside the standard NDCG@10 of the same ranking. Its loss is ours: sentence-transformers' cached MNRL at scale 20
(configs/IR/msmarco_pairs_*.yaml) is InfoNCE over cosine similarities at temperature 1/20 = 0.05; the cache only
splits the batch's forward passes (mini_batch_size 4) without changing the loss. As there, the loss is computed
in fp32 from fp32 embeddings (`contrastive_loss`, precision.py), the rows come in sentence-transformers' order
(data_order.py), and EncodEval's evaluation encodes 4 texts at a time (IR.py encode_sequences)."""
from __future__ import annotations

from pathlib import Path

import torch

from mlmclm.eval.finetune.data_order import SENTENCE_TRANSFORMERS
from mlmclm.eval.finetune.device import on_device
from mlmclm.eval.finetune.encodeval_heads import EncodEvalRetrievalEncoder
from mlmclm.eval.finetune.encodeval_inputs import (encodeval_tokenizer, retrieval_eval_inputs, retrieval_lengths,
                                                   text_inputs)
from mlmclm.eval.finetune.encodeval_scores import retrieval_score
from mlmclm.eval.finetune.heads import MeanPoolingEncoder, info_nce_loss
from mlmclm.eval.finetune.metrics import ndcg_at_k
from mlmclm.eval.finetune.task_spec import TaskData
from mlmclm.eval.finetune.training import (ENCODEVAL_EVAL_BATCH_SIZE, FinetuneConfig, RunOutcome, batched,
                                           in_precision, load_tokenizer, max_length_of, pad_batch, seed_everything,
                                           train)

TEMPERATURE = 0.05


def contrastive_loss(queries: torch.Tensor, passages: torch.Tensor, normalise: bool) -> torch.Tensor:
    """InfoNCE at TEMPERATURE over in-batch negatives, in fp32 whatever the tower's precision: CachedMNRL gets the
    embeddings in fp32 (accelerate converts the bf16 model's outputs) and computes the cosine's normalisation,
    the similarities and the cross entropy outside autocast. `normalise`: the cosine's L2 normalisation
    (EncodEval's tower returns pooled vectors as they are; the standard tower normalises them itself)."""
    queries, passages = queries.float(), passages.float()
    if normalise:
        queries = torch.nn.functional.normalize(queries, dim=-1)
        passages = torch.nn.functional.normalize(passages, dim=-1)
    return info_nce_loss(queries, passages, TEMPERATURE)


def _embed(model, tokenizer, texts, max_length, batch_size, encodeval=False, device="cpu"):
    out = []
    with torch.no_grad():
        for chunk in batched(texts, batch_size):
            enc = (retrieval_eval_inputs(tokenizer, list(chunk), max_length) if encodeval else
                   tokenizer(list(chunk), truncation=True, max_length=max_length, padding=True, return_tensors="pt"))
            enc = on_device({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}, device)
            out.append(model(enc["input_ids"], enc["attention_mask"]))
    vectors = torch.cat(out).float()  # ranked in fp32 whatever the fine-tuning precision, as sentence-transformers does
    # EncodEval's pooled vectors are not normalised by the model: its cosine similarity normalises them in fp32
    return torch.nn.functional.normalize(vectors, dim=-1) if encodeval else vectors


def corpus_of(rows) -> list[str]:
    """Unique passages of a split in first-seen order (deterministic ids)."""
    seen: dict[str, None] = {}
    for row in rows:
        for passage in row["positives"] + row["negatives"]:
            seen.setdefault(passage, None)
    return list(seen)


def evaluation_sets(data: TaskData, seed: int) -> dict[str, tuple[dict[str, list], dict[str, str] | None]]:
    """The sets a run scores: the task's own splits under "" and each extra set by name (NQ-style sets halved for
    this seed), each with its id-keyed corpus when it has one."""
    sets = {"": ({split: data.splits[split] for split in ("validation", "test") if split in data.splits},
                 data.corpus)}
    sets.update({name: (extra.for_seed(seed), extra.corpus) for name, extra in data.extra_tests.items()})
    return sets


def ranking_inputs(rows, corpus: dict[str, str] | None, passages: list[str]):
    """(document ids, document texts, relevant ids per row): by id when the set has an id-keyed corpus (two
    documents with one text stay two), else by text over `passages`."""
    if corpus is not None:
        return list(corpus), list(corpus.values()), [set(r["positive_ids"]) for r in rows]
    index = {passage: str(i) for i, passage in enumerate(passages)}
    return list(index.values()), passages, [{index[p] for p in r["positives"]} for r in rows]


def shared_corpus(data: TaskData, name: str) -> bool:
    """Whether a set ranks against one corpus for both its splits — the documents of both splits' qrels, as
    EncodEval builds BEIR/MLDR sets — rather than each split against its own passages."""
    protocol = data.spec.split_protocol if not name else data.spec.extra_tests[name].get("split_protocol", "given")
    return protocol in ("official", "seeded_halves")


def run_retrieval(model_dir: Path, data: TaskData, config: FinetuneConfig,
                  eval_splits: tuple[str, ...] = ("validation", "test"), on_trained=None) -> RunOutcome:
    """`on_trained(encoder, tokenizer)`, when given, receives the fine-tuned encoder (its `AutoModel`) and the
    tokenizer the evaluation embeds with, before scoring (mlmclm/export/retriever.py keeps them)."""
    encodeval = data.spec.rules == "encodeval"
    tokenizer = encodeval_tokenizer(model_dir) if encodeval else load_tokenizer(model_dir)
    seed_everything(config.seed)
    model = in_precision(EncodEvalRetrievalEncoder(model_dir) if encodeval else MeanPoolingEncoder(model_dir), config)
    max_length = eval_length = max_length_of(data.spec, model_dir)
    if encodeval and data.spec.max_length is None:
        max_length, eval_length = retrieval_lengths(tokenizer, model_dir)

    query, document = data.spec.query_prefix, data.spec.document_prefix
    pairs = [(query + row["query"], document + positive) for row in data["train"] for positive in row["positives"]]

    def tokenize(texts):  # training inputs: EncodEval's training collator calls IR.py tokenize (text + EOS)
        if encodeval:
            return text_inputs(tokenizer, texts, max_length)
        return tokenizer(texts, truncation=True, max_length=max_length, padding=True)

    def collate(chunk):
        queries, passages = tokenize([q for q, _ in chunk]), tokenize([p for _, p in chunk])
        pads = {"input_ids": tokenizer.pad_token_id, "attention_mask": 0}
        return (pad_batch([{"input_ids": i, "attention_mask": m} for i, m in
                           zip(queries["input_ids"], queries["attention_mask"])], pads),
                pad_batch([{"input_ids": i, "attention_mask": m} for i, m in
                           zip(passages["input_ids"], passages["attention_mask"])], pads))

    def loss(forward, batch):  # outside autocast: the forward returns fp32 embeddings (precision.TrainerForward)
        return contrastive_loss(forward(**batch[0]), forward(**batch[1]), normalise=encodeval)

    log = train(model, pairs, collate, loss, config, f"{data.spec.name} lr={config.learning_rate:g}",
                order=SENTENCE_TRANSFORMERS)
    if on_trained is not None:
        on_trained(model.encoder, tokenizer)

    # EncodEval encodes in a fresh process, without the Trainer's autocast: the bf16 model called as it is, 4 texts
    # a time in the corpus' and the queries' order (SentenceTransformer.encode sorts each 4 by length: same batch)
    eval_batch_size = ENCODEVAL_EVAL_BATCH_SIZE if encodeval else config.eval_batch_size

    def score(rows, ids, texts, relevant):
        doc_vectors = _embed(model, tokenizer, [document + p for p in texts], eval_length, eval_batch_size, encodeval,
                             config.device)
        query_vectors = _embed(model, tokenizer, [query + r["query"] for r in rows], eval_length, eval_batch_size,
                               encodeval, config.device)
        similarities = query_vectors @ doc_vectors.T
        top = similarities.topk(min(10, len(ids)), dim=-1).indices.tolist()
        rankings = [[ids[i] for i in ranked] for ranked in top]
        scores = {"ndcg@10": ndcg_at_k(rankings, relevant, k=10), "queries": len(rows), "corpus": len(ids)}
        if encodeval:
            column = {doc: i for i, doc in enumerate(ids)}
            scores["encodeval_ndcg@10"] = retrieval_score(similarities.cpu().numpy(),
                                                          [{column[doc] for doc in wanted} for wanted in relevant])
        return scores

    metrics = {}
    for name, (splits, id_corpus) in evaluation_sets(data, config.seed).items():
        shared = shared_corpus(data, name)
        passages = corpus_of([row for split in ("validation", "test") for row in splits.get(split, [])])
        for split in eval_splits:
            if split in splits:
                key = split if not name else f"{split}:{name}"
                rows = splits[split]
                metrics[key] = score(rows, *ranking_inputs(rows, id_corpus, passages if shared else corpus_of(rows)))
    return RunOutcome(metrics=metrics, log=log)
