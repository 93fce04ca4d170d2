"""`tools/convert_to_hf.py … --sentence-transformers`: the export is also a sentence-transformers model that the real
library loads without code of ours or remote code, embedding as our retrieval evaluation's mean-pooled tower does.
Its source carries remote-code hooks (tests/planted_hooks.py), as EuroBERT's own repository does: none reaches the
checkpoint's tokenizer or either export (issue 56)."""
import logging
import shutil

import pytest
import torch
from convert_fixtures import assert_untouched, make_random_eurobert, make_tokenizer, read_json, tool_main

from mlmclm.convert.from_hf import ImportConfig, convert_from_hf
from mlmclm.eval.finetune.heads import MeanPoolingEncoder
from mlmclm.eval.finetune.retrieval import _embed
from mlmclm.eval.finetune.training import load_tokenizer
from tests.planted_hooks import plant_remote_code_hooks, remote_code_hooks

sentence_transformers = pytest.importorskip("sentence_transformers")  # the `test` extra


def test_convert_to_hf_writes_a_sentence_transformer(tmp_path, capsys):
    source = make_random_eurobert(tmp_path / "hf")
    shutil.copytree(make_tokenizer(tmp_path / "tok"), source, dirs_exist_ok=True)
    assert remote_code_hooks(plant_remote_code_hooks(source))
    run = tmp_path / "run"
    convert_from_hf(ImportConfig(str(source), run, progress=False))
    assert remote_code_hooks(run) == []  # the tokenizer the checkpoint carries
    out = tmp_path / "st"
    convert = tool_main("convert_to_hf")
    assert convert([str(run), str(out), "--sentence-transformers", "--query-prompt", "search_query: ",
                    "--max-seq-length", "6"]) == 0
    assert read_json(out / "config_sentence_transformers.json")["prompts"] == {"query": "search_query: ",
                                                                             "document": "Document: "}
    assert remote_code_hooks(out) == []
    # a plain export, its tokenizer given as the hooked source itself (--tokenizer)
    assert convert([str(run), str(tmp_path / "plain"), "--tokenizer", str(source)]) == 0
    assert remote_code_hooks(tmp_path / "plain") == []
    reports = []  # transformers' own logger (it does not propagate to pytest's capture)
    listener = logging.Handler()
    listener.emit = lambda record: reports.append(record.getMessage())
    logging.getLogger("transformers").addHandler(listener)
    try:
        model = sentence_transformers.SentenceTransformer(str(out), device="cpu", trust_remote_code=False)
    finally:
        logging.getLogger("transformers").removeHandler(listener)
    assert model.max_seq_length == 6
    # no load report: the module's weights are the encoder alone (they held the MLM head: lm_head.weight UNEXPECTED)
    assert not [text for text in reports if "LOAD REPORT" in text or "UNEXPECTED" in text], reports
    # the top folder is still the MLM export, every weight used
    from transformers import AutoModelForMaskedLM

    _, info = AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    texts = ["the cat sat on the mat", "a red dog ran fast", "hello"]
    tower, tokenizer = MeanPoolingEncoder(out).eval(), load_tokenizer(out)
    torch.testing.assert_close(model.encode_query(texts, convert_to_tensor=True),
                               _embed(tower, tokenizer, ["search_query: " + t for t in texts], 6, 8), atol=1e-5,
                               rtol=0)
    torch.testing.assert_close(model.encode_document(texts, convert_to_tensor=True),
                               _embed(tower, tokenizer, ["Document: " + t for t in texts], 6, 8), atol=1e-5, rtol=0)

    # a length past the model's positions: one line, nothing written
    capsys.readouterr()
    assert convert([str(run), str(tmp_path / "bad"), "--sentence-transformers", "--max-seq-length", "4096"]) == 2
    assert "max_seq_length 4096 exceeds the model's max_position_embeddings" in capsys.readouterr().err
    assert_untouched(tmp_path / "bad")
    # prompts without --sentence-transformers are refused rather than ignored
    assert convert([str(run), str(tmp_path / "bad"), "--query-prompt", "q: "]) == 2
    assert "need --sentence-transformers" in capsys.readouterr().err
