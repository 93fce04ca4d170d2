"""The sentence-transformers directories we write, loaded by the real `sentence-transformers` (no code of ours at
load time, no remote code): they embed as our retrieval evaluation does, under both rules, and the retriever
`tools/evaluate.py grid --keep-retriever` keeps reproduces its recorded NDCG@10 when re-scored through them, and
carries none of the remote-code hooks of the model it was fine-tuned from (issue 56)."""
import json
import shutil
import subprocess
import sys

import pytest
import torch
from eval_fixtures import make_task_folder

from mlmclm.eval.finetune.encodeval_heads import EncodEvalRetrievalEncoder
from mlmclm.eval.finetune.heads import MeanPoolingEncoder
from mlmclm.eval.finetune.retrieval import _embed, corpus_of, ranking_inputs
from mlmclm.eval.finetune.metrics import ndcg_at_k
from mlmclm.eval.finetune.task_spec import TaskSpec
from mlmclm.export.retriever import retrieval_layout, retrieval_tokenizer
from mlmclm.export.sentence_transformers import write_sentence_transformer_files
from tests.planted_hooks import plant_remote_code_hooks, remote_code_hooks

sentence_transformers = pytest.importorskip("sentence_transformers")  # the `test` extra

QUERIES = ["color of alice", "where does bob live ?", "who is red and blue", "the cat sat"]
DOCUMENTS = ["alice is red", "bob lives in paris . carol lives in rome .", "dave is green cat", "a dog ran"]


def _load(directory):
    return sentence_transformers.SentenceTransformer(str(directory), device="cpu", trust_remote_code=False)


@pytest.mark.parametrize("rules", ["standard", "encodeval"])
def test_sentence_transformer_embeds_as_our_evaluation(tmp_path, tiny_model_dir, rules):
    directory = shutil.copytree(tiny_model_dir, tmp_path / "st")
    spec = TaskSpec(name="r", family="retrieval", path=str(tmp_path), query_prefix="Query: ",
                    document_prefix="Document: ", rules=rules, max_length=None if rules == "encodeval" else 8)
    layout = retrieval_layout(spec, directory)
    retrieval_tokenizer(spec, directory).save_pretrained(str(directory))  # as the kept retriever saves it
    write_sentence_transformer_files(directory, layout)
    tower = (EncodEvalRetrievalEncoder if rules == "encodeval" else MeanPoolingEncoder)(directory).eval()
    tokenizer = retrieval_tokenizer(spec, directory)
    length = 512 if rules == "encodeval" else 8  # max positions (EncodEval's evaluation), else the task's length
    assert layout.max_seq_length == length and layout.pooling == "mean"
    ours_q = _embed(tower, tokenizer, ["Query: " + q for q in QUERIES], length, 2, rules == "encodeval")
    ours_d = _embed(tower, tokenizer, ["Document: " + d for d in DOCUMENTS], length, 2, rules == "encodeval")

    model = _load(directory)
    assert model.max_seq_length == length
    theirs_q = model.encode_query(QUERIES, convert_to_tensor=True, batch_size=3)  # the prompt from the directory
    theirs_d = model.encode_document(DOCUMENTS, convert_to_tensor=True, batch_size=3)
    assert theirs_q.dtype == torch.float32
    torch.testing.assert_close(theirs_q, ours_q, atol=1e-5, rtol=0)
    torch.testing.assert_close(theirs_d, ours_d, atol=1e-5, rtol=0)
    # the prompts matter (the test would not notice them missing otherwise), and the length cuts (standard: 8)
    assert (model.encode(QUERIES, convert_to_tensor=True) - ours_q).abs().max() > 1e-3
    if rules == "standard":
        untruncated = _embed(tower, tokenizer, ["Document: " + DOCUMENTS[1]], 64, 1)
        assert (untruncated - ours_d[1:2]).abs().max() > 1e-3


def test_refuses_a_length_past_the_model_positions(tmp_path, tiny_model_dir):
    from mlmclm.export.sentence_transformers import SentenceTransformerLayout

    directory = shutil.copytree(tiny_model_dir, tmp_path / "st")
    with pytest.raises(ValueError, match="max_seq_length 600 exceeds the model's max_position_embeddings 512"):
        write_sentence_transformer_files(directory, SentenceTransformerLayout(max_seq_length=600))
    with pytest.raises(ValueError, match="pooling must be one of"):
        SentenceTransformerLayout(pooling="cls")


def _cli(*args):
    return subprocess.run([sys.executable, "tools/evaluate.py", *map(str, args)], capture_output=True, text=True)


def test_kept_retriever_reproduces_its_recorded_ndcg_through_sentence_transformers(tmp_path, tiny_model_dir):
    folder = make_task_folder(tmp_path / "colors", "retrieval", sizes=(32, 12, 12))
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([{"name": "colors", "family": "retrieval", "path": str(folder), "max_length": 16,
                                  "query_prefix": "Query: ", "document_prefix": "Document: "}]))
    keep = tmp_path / "kept"
    hooked = plant_remote_code_hooks(shutil.copytree(tiny_model_dir, tmp_path / "hooked"))  # config and tokenizer
    args = ("grid", "--model", f"tiny={hooked}", "--tasks", tasks, "--lrs", "1e-3", "3e-3", "--seeds", "0",
            "1", "--max-steps", "6", "--min-steps", "0", "--batch-size", "8", "--output", tmp_path / "out",
            "--keep-retriever", keep)
    result = _cli(*args)
    assert result.returncode == 0, result.stderr
    kept = keep / "tiny" / "colors"
    assert f"as a sentence-transformers model: {kept}" in result.stdout
    assert remote_code_hooks(kept) == []
    record = json.loads((kept / "retriever.json").read_text())
    grid = json.loads((tmp_path / "out" / "runs" / "tiny" / "colors" /
                       f"lr{record['learning_rate']:g}_seed{record['seed']}.json").read_text())
    assert record["metrics"]["test"]["ndcg@10"] == grid["test"]["ndcg@10"]  # retrained = the grid's run (CPU)

    model = _load(kept)
    rows = [json.loads(line) for line in (folder / "test.jsonl").read_text().splitlines()]
    ids, texts, relevant = ranking_inputs(rows, None, corpus_of(rows))
    similarities = (model.encode_query([r["query"] for r in rows], convert_to_tensor=True)
                    @ model.encode_document(texts, convert_to_tensor=True).T)
    rankings = [[ids[i] for i in top] for top in similarities.topk(10, dim=-1).indices.tolist()]
    assert ndcg_at_k(rankings, relevant, k=10) == pytest.approx(grid["test"]["ndcg@10"], abs=1e-9)
    # and the retriever is not the untrained model: the base model ranks otherwise
    base = MeanPoolingEncoder(tiny_model_dir).eval()
    assert not torch.allclose(base.encoder.embed_tokens.weight, model[0].auto_model.embed_tokens.weight)

    before = sorted(p.name for p in kept.iterdir())
    again = _cli(*args)  # nothing overwritten: refused before any fine-tuning
    assert again.returncode == 2 and f"{kept} already exists" in again.stderr, again.stderr
    assert sorted(p.name for p in kept.iterdir()) == before
