import gzip
import tarfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_fixtures import make_docs, write_jsonl
from transformers import AutoTokenizer

import tools.prepare_data as cli
from mlmclm.data.manifest import Manifest
from mlmclm.data.prepare import PrepareConfig, prepare
from mlmclm.data.shards import read_shard
from mlmclm.data.sources import PrepareError


def cfg(inputs, out, tok_dir, **kw):
    kw = {"seq_length": 32, "samples_per_shard": 50, "rows_per_block": 16, "workers": 1, "progress": False, **kw}
    return PrepareConfig(inputs=[str(i) for i in inputs], output_dir=str(out), tokenizer=str(tok_dir), **kw)


def documents_in(out) -> tuple[list[list[int]], Manifest]:
    """All documents of a prepared dataset, in stream order, as token id lists (BOS/EOS stripped)."""
    m = Manifest.load(out)
    rows = [read_shard(m.shard_url(s.name), s, m.seq_length, m.tokenizer["pad_id"]) for s in m.shards]
    tokens = np.concatenate([t for t, _ in rows]).reshape(-1)
    tokens = tokens[tokens != m.tokenizer["pad_id"]]
    bos, eos = m.tokenizer["bos_id"], m.tokenizer["eos_id"]
    starts = np.flatnonzero(tokens == bos)
    return [tokens[s + 1:e].tolist() if (e := _next(tokens, s, eos)) else tokens[s + 1:].tolist() for s in starts], m


def _next(tokens, start, eos):
    hits = np.flatnonzero(tokens[start:] == eos)
    return start + hits[0] if len(hits) else None


def test_round_trip_all_input_kinds(tmp_path, tok_dir, docs):
    src = tmp_path / "src"
    (src / "nested").mkdir(parents=True)
    write_jsonl(src / "a.jsonl", docs[:100])
    with gzip.open(src / "nested" / "b.jsonl.gz", "wt") as f:
        f.write(write_jsonl(tmp_path / "tmp.jsonl", docs[100:200]).read_text())
    pq.write_table(pa.table({"body": docs[200:300]}), src / "c.parquet")
    (src / "d.txt").write_text(docs[300])
    (tmp_path / "e.txt.gz").write_bytes(gzip.compress(docs[301].encode()))
    inputs = [src / "a.jsonl", src / "nested", src / "c.parquet", f"{src}/d.t?t", tmp_path / "e.txt.gz"]
    with pytest.raises(PrepareError, match="c.parquet: no column 'text'"):
        prepare(cfg(inputs, tmp_path / "bad", tok_dir))
    (src / "c.parquet").unlink()
    pq.write_table(pa.table({"text": docs[200:300]}), src / "c.parquet")

    m = prepare(cfg(inputs, tmp_path / "out", tok_dir))
    found, loaded = documents_in(tmp_path / "out")
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    assert [tok.decode(ids) for ids in found] == docs[:302]
    assert m.num_documents == 302 and loaded.num_samples == m.num_samples == sum(s.num_samples for s in m.shards)
    assert m.num_tokens == sum(len(ids) + 2 for ids in found)
    assert loaded.tokenizer["vocab_hash"] and loaded.tokenizer["mask_id"] == tok.mask_token_id
    assert loaded.seq_length == 32 and len(loaded.inputs) == 5


def test_document_ids_mark_boundaries(dataset):
    m = Manifest.load(dataset)
    tokens, doc_ids = read_shard(m.shard_url(m.shards[1].name), m.shards[1], m.seq_length, m.tokenizer["pad_id"])
    bos = m.tokenizer["bos_id"]
    starts = (tokens == bos)
    starts[:, 0] = False
    expected = np.cumsum(starts, axis=1)
    assert np.array_equal(doc_ids, expected) and doc_ids.max() > 0


def test_deterministic_across_workers_and_idempotent(tmp_path, tok_dir, docs):
    write_jsonl(tmp_path / "a.jsonl", docs)
    one = prepare(cfg([tmp_path / "a.jsonl"], tmp_path / "one", tok_dir, workers=1, docs_per_task=7))
    two = prepare(cfg([tmp_path / "a.jsonl"], tmp_path / "two", tok_dir, workers=2, docs_per_task=7))
    assert one.shards == two.shards
    for s in one.shards:
        assert (tmp_path / "one" / s.name).read_bytes() == (tmp_path / "two" / s.name).read_bytes()
    before = {p.name: p.read_bytes() for p in (tmp_path / "one").iterdir()}
    prepare(cfg([tmp_path / "a.jsonl"], tmp_path / "one", tok_dir, workers=1, docs_per_task=7))  # re-run
    assert {p.name: p.read_bytes() for p in (tmp_path / "one").iterdir()} == before
    small = prepare(cfg([tmp_path / "a.jsonl"], tmp_path / "one", tok_dir, max_tokens=1000))
    assert small.num_tokens == 1000 and len(small.shards) == 1      # a smaller re-run drops the old shards
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["manifest.json", "shard-000000.tar"]


def test_bad_inputs_give_clear_errors(tmp_path, tok_dir, capsys):
    good = write_jsonl(tmp_path / "good.jsonl", ["some text"])
    wrong_field = write_jsonl(tmp_path / "wrong.jsonl", ["some text"], field="content")
    (tmp_path / "broken.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    (tmp_path / "empty.jsonl").write_text('{"text": "  "}\n')
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00bad")
    cases = [
        ([tmp_path / "missing.jsonl"], {}, "missing.jsonl.*no such file"),
        ([wrong_field], {}, r"wrong.jsonl:1: no field 'text'"),
        ([tmp_path / "broken.jsonl"], {}, r"broken.jsonl:2: invalid JSON"),
        ([tmp_path / "empty.jsonl"], {}, "empty corpus"),
        ([tmp_path / "binary.txt"], {}, "cannot read .*binary.txt"),
        ([good], {"tokenizer": str(tmp_path / "nope")}, "cannot load tokenizer"),
    ]
    for inputs, extra, pattern in cases:
        with pytest.raises(PrepareError, match=pattern):
            prepare(cfg(inputs, tmp_path / "out", extra.pop("tokenizer", tok_dir), **extra))
        assert not (tmp_path / "out" / "manifest.json").exists()
    # A tokenizer without a mask token: refused when MLM is intended, fine for CLM-only data.
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    tok.mask_token = None
    tok.save_pretrained(str(tmp_path / "nomask"))
    with pytest.raises(PrepareError, match="no mask token"):
        prepare(cfg([good], tmp_path / "out", tmp_path / "nomask"))
    prepare(cfg([good], tmp_path / "out", tmp_path / "nomask", seq_length=4, require_mask_token=False))
    # The CLI turns these into one line on stderr and exit status 2.
    rc = cli.main(["--input", str(wrong_field), "--output", str(tmp_path / "o2"), "--tokenizer", str(tok_dir),
                   "--seq-length", "8", "--workers", "1", "--no-progress"])
    assert rc == 2 and "wrong.jsonl:1: no field 'text'" in capsys.readouterr().err


def test_a_failed_or_interrupted_run_writes_nothing(tmp_path, tok_dir, docs, monkeypatch):
    """The dataset is staged beside its output and published at the end: a failure leaves no output (not even the
    parent folder made for it), an interrupted re-run leaves the earlier dataset as it was, no staging folder
    stays behind. A partitioned job writes its part in place: complete shards only, no manifest."""
    src = write_jsonl(tmp_path / "a.jsonl", docs)
    with open(src, "a") as f:
        f.write("not json\n")   # fails after several shards were written
    with pytest.raises(PrepareError, match="a.jsonl:401"):
        prepare(cfg([src], tmp_path / "new" / "out", tok_dir, docs_per_task=20))
    assert not (tmp_path / "new").exists()

    # A crash while a shard is being written, in a re-run over an earlier dataset.
    good = write_jsonl(tmp_path / "b.jsonl", docs)
    prepare(cfg([good], tmp_path / "out2", tok_dir, max_tokens=3000))
    before = {p.name: p.read_bytes() for p in (tmp_path / "out2").iterdir()}
    import webdataset
    calls = {"n": 0}
    real_write = webdataset.TarWriter.write

    def failing_write(self, obj):
        calls["n"] += 1
        if calls["n"] == 7:
            raise KeyboardInterrupt
        return real_write(self, obj)

    monkeypatch.setattr(webdataset.TarWriter, "write", failing_write)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg([good], tmp_path / "out2", tok_dir))
    assert {p.name: p.read_bytes() for p in (tmp_path / "out2").iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl", "out2"]  # no staging folder left
    monkeypatch.undo()

    with pytest.raises(PrepareError, match="a.jsonl:401"):
        prepare(cfg([src], tmp_path / "parts", tok_dir, docs_per_task=20, partition=0, num_partitions=2))
    _assert_only_complete_shards(tmp_path / "parts" / "part-00000-of-00002")


def test_a_validation_split_the_corpus_cannot_give_is_refused_and_writes_nothing(tmp_path, tok_dir, capsys):
    """`--validation-every 10` on 4 text files (a .txt file is one document): one line, exit 2, no output folder
    (it used to leave 4 shards and no manifest)."""
    texts = []
    for i, text in enumerate(make_docs(4)):
        (tmp_path / f"t{i}.txt").write_text(text * 20)
        texts.append(str(tmp_path / f"t{i}.txt"))
    rc = cli.main(["--input", *texts, "--output", str(tmp_path / "data" / "mine"), "--tokenizer", str(tok_dir),
                   "--seq-length", "8", "--samples-per-shard", "10", "--validation-every", "10", "--workers", "1",
                   "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err == ("error: validation_every 10: no document held out (the corpus has 4 documents, fewer "
                               "than 10; a .txt file is one document, a .jsonl line one); lower it\n"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"t{i}.txt" for i in range(4)]


def _assert_only_complete_shards(out):
    names = sorted(p.name for p in out.iterdir())
    assert "manifest.json" not in names and not any(".tmp" in n for n in names)
    assert names, "expected some complete shards before the failure"
    for name in names:
        with tarfile.open(out / name) as tar:
            members = tar.getnames()
        assert len(members) % 2 == 0 and len(members) == 2 * ((50 + 15) // 16)


def test_embedded_corpus_dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("MLMCLM_CACHE", str(tmp_path / "cache"))
    from mlmclm.data.prepare import prepare_embedded_corpus

    m = prepare_embedded_corpus(tmp_path / "demo", seq_length=128, max_tokens=20_000, workers=1, progress=False)
    assert m.num_tokens == 20_000 and m.num_samples == -(-20_000 // 128)
    assert m.tokenizer["vocab_size"] == 8192 and m.tokenizer["mask_id"] is not None
    assert "prepare_embedded_corpus" in m.command


def test_make_docs_fixture_is_varied():
    assert len(set(make_docs(50))) == 50


def test_a_capped_preparation_tokenizes_about_the_documents_it_writes(tmp_path, tok_dir, docs, monkeypatch):
    """With max_tokens, each batch of documents is tokenized in parts of 1, 2, 4, ... documents: a preparation that
    needs the first few documents of a large corpus stops tokenizing soon after (the tiny recipes' 40k tokens are
    one or two of the embedded corpus's 42 works, which one batch of 512 tokenized whole). The rows are those of
    the same documents in the same order."""
    from mlmclm.data import prepare as module

    tokenized, encode = [], module._encode

    def counted(texts, tokenizer=None):  # the real tokenization, counted
        tokenized.extend(texts)
        return encode(texts, tokenizer)

    monkeypatch.setattr(module, "_encode", counted)
    write_jsonl(tmp_path / "a.jsonl", docs)
    capped = prepare(cfg([tmp_path / "a.jsonl"], tmp_path / "capped", tok_dir, max_tokens=1000, docs_per_task=512))
    capped_docs, _ = documents_in(tmp_path / "capped")
    assert capped.num_tokens == 1000 and len(capped_docs) < 40 and len(tokenized) < 2 * len(capped_docs), (
        len(tokenized), len(capped_docs))
    monkeypatch.setattr(module, "_encode", encode)
    prepare(cfg([tmp_path / "a.jsonl"], tmp_path / "whole", tok_dir, docs_per_task=512))
    whole_docs, _ = documents_in(tmp_path / "whole")
    assert capped_docs[:-1] == whole_docs[:len(capped_docs) - 1]  # the last one is cut at the cap
    assert whole_docs[len(capped_docs) - 1][:len(capped_docs[-1])] == capped_docs[-1]
