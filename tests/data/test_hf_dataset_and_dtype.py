import json
import shutil

import datasets
import numpy as np
import pytest
import torch
from data_fixtures import write_jsonl

import tools.prepare_data as cli
from mlmclm.data.loader import LoaderConfig, PackedLoader
from mlmclm.data.manifest import Manifest
from mlmclm.data.partition import merge
from mlmclm.data.prepare import PrepareConfig, prepare
from mlmclm.data.shards import ShardError, read_shard, token_dtype, write_shard
from mlmclm.data.sources import PrepareError


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def cfg(out, tok_dir, inputs=(), **kw):
    kw = {"seq_length": 32, "samples_per_shard": 50, "rows_per_block": 16, "workers": 1, "progress": False, **kw}
    return PrepareConfig(inputs=[str(i) for i in inputs], output_dir=str(out), tokenizer=str(tok_dir), **kw)


def same_shards(a, b) -> bool:
    ma, mb = Manifest.load(a), Manifest.load(b)
    return ma.shards == mb.shards and all((a / s.name).read_bytes() == (b / s.name).read_bytes() for s in ma.shards)


def test_hf_dataset_gives_the_same_shards_as_the_files(tmp_path, tok_dir, docs):
    write_jsonl(tmp_path / "docs.jsonl", docs)
    prepare(cfg(tmp_path / "files", tok_dir, [tmp_path / "docs.jsonl"]))
    table = {"body": docs, "id": list(range(len(docs)))}
    datasets.Dataset.from_dict(table).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"body": docs[:10]}),
                          "validation": datasets.Dataset.from_dict(table)}).save_to_disk(str(tmp_path / "dict"))
    (tmp_path / "parquet").mkdir()
    datasets.Dataset.from_dict(table).to_parquet(str(tmp_path / "parquet" / "train-00000.parquet"))
    runs = {
        "saved": dict(dataset=str(tmp_path / "saved")),
        "saved_streaming": dict(dataset=str(tmp_path / "saved"), streaming=True),
        "dict_split": dict(dataset=str(tmp_path / "dict"), split="validation"),
        "load_dataset": dict(dataset=str(tmp_path / "parquet")),                   # load_dataset on a local dir
        "load_dataset_streaming": dict(dataset=str(tmp_path / "parquet"), streaming=True),
    }
    for name, kw in runs.items():
        m = prepare(cfg(tmp_path / name, tok_dir, text_field="body", **kw))
        assert m.num_documents == len(docs) and same_shards(tmp_path / "files", tmp_path / name), name
    assert m.inputs == [f"hf:{tmp_path / 'parquet'}[train]"]
    # max_tokens and the CLI.
    rc = cli.main(["--dataset", str(tmp_path / "saved"), "--text-field", "body", "--output", str(tmp_path / "cli"),
                   "--tokenizer", str(tok_dir), "--seq-length", "32", "--workers", "1", "--no-progress",
                   "--max-tokens", "500"])
    assert rc == 0 and Manifest.load(tmp_path / "cli").num_tokens == 500
    # Partitions of a dataset merge into the same rows.
    for i in range(3):
        prepare(cfg(tmp_path / "parts", tok_dir, dataset=str(tmp_path / "saved"), text_field="body", partition=i,
                    num_partitions=3, group_docs=30, samples_per_shard=1000))
    prepare(cfg(tmp_path / "grouped", tok_dir, dataset=str(tmp_path / "saved"), text_field="body", group_docs=30))
    merge(tmp_path / "parts")
    n = Manifest.load(tmp_path / "grouped").num_samples
    load = lambda p: sorted(map(tuple, PackedLoader(LoaderConfig(str(p), n, n)).next_global_batch()[0]["tokens"]
                                .tolist()))
    assert load(tmp_path / "parts") == load(tmp_path / "grouped")


def test_hf_dataset_errors_are_named(tmp_path, tok_dir, docs, capsys):
    datasets.Dataset.from_dict({"body": docs[:5]}).save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs[:5]})}).save_to_disk(str(tmp_path / "d"))
    datasets.Dataset.from_dict({"text": [1, 2]}).save_to_disk(str(tmp_path / "ints"))
    two = {"train": datasets.Dataset.from_dict({"text": docs[:5]}),
           "validation": datasets.Dataset.from_dict({"text": docs[:3]})}
    datasets.DatasetDict(two).save_to_disk(str(tmp_path / "two"))
    cases = [
        (dict(dataset=str(tmp_path / "saved")), r"saved.*no field 'text' \(found \['body'\]\)"),
        (dict(dataset=str(tmp_path / "d"), split="test"), r"no split 'test' \(found \['train'\]\)"),
        # several splits and no --split: refused, not silently "train"
        (dict(dataset=str(tmp_path / "two")), r"holds the splits \['train', 'validation'\]: choose one with --split"),
        (dict(dataset=str(tmp_path / "ints")), "row 0: field 'text' is int, not text"),
    ]
    for kw, pattern in cases:
        with pytest.raises(PrepareError, match=pattern):
            prepare(cfg(tmp_path / "out", tok_dir, **kw))
        assert not (tmp_path / "out" / "manifest.json").exists()
    with pytest.raises(PrepareError, match="not both"):
        cfg(tmp_path / "out", tok_dir, [tmp_path / "x.jsonl"], dataset="x")
    with pytest.raises(SystemExit):
        cli.main(["--dataset", "x", "--input", "y", "--output", "o", "--seq-length", "8"])
    assert "one of --input, --dataset or --embedded" in capsys.readouterr().err


def test_uint16_when_the_vocabulary_fits_and_int32_still_read(dataset, tmp_path, tok_dir, docs):
    assert (token_dtype(300), token_dtype(65536), token_dtype(65537), token_dtype(128256)) == \
           ("uint16", "uint16", "int32", "int32")
    m16 = Manifest.load(dataset)
    assert m16.dtype == "uint16" and m16.format == "mlmclm-packed-v2"
    tokens, _ = read_shard(m16.shard_url(m16.shards[0].name), m16.shards[0], 32, m16.tokenizer["pad_id"], "uint16")
    assert tokens.dtype == np.uint16
    write_jsonl(tmp_path / "docs.jsonl", docs)
    kw = dict(samples_per_shard=100, rows_per_block=16)       # as the `dataset` fixture
    m32 = prepare(cfg(tmp_path / "int32", tok_dir, [tmp_path / "docs.jsonl"], token_dtype="int32", **kw))
    assert m32.dtype == "int32" and [s.checksum for s in m32.shards] == [s.checksum for s in m16.shards]
    def token_bytes(d):   # tokens.npy payloads (at 32 tokens per row, tar headers dominate these tiny files)
        import tarfile
        total = 0
        for s in Manifest.load(d).shards:
            with tarfile.open(d / s.name) as tar:
                total += sum(t.size - 128 for t in tar.getmembers() if t.name.endswith("tokens.npy"))
        return total

    assert token_bytes(tmp_path / "int32") == 2 * token_bytes(dataset) == 4 * 32 * m16.num_samples

    def stream(path):
        loader = PackedLoader(LoaderConfig(str(path), 64, 16))
        return [torch.cat([mb[k] for mb in loader.next_global_batch()]) for _ in range(50)
                for k in ("tokens", "document_ids")]

    ref = stream(dataset)
    assert all(torch.equal(a, b) for a, b in zip(stream(tmp_path / "int32"), ref))
    # A dataset written before uint16 (manifest v1, int32 shards) reads the same.
    v1 = json.loads((tmp_path / "int32" / "manifest.json").read_text())
    for key in ("partition", "tails", "parts"):
        v1.pop(key)
    v1["format"] = "mlmclm-packed-v1"
    (tmp_path / "int32" / "manifest.json").write_text(json.dumps(v1))
    assert all(torch.equal(a, b) for a, b in zip(stream(tmp_path / "int32"), ref))
    # Shards whose dtype is not the manifest's are refused by name; ids beyond uint16 are never truncated.
    v1["dtype"] = "uint16"
    (tmp_path / "int32" / "manifest.json").write_text(json.dumps(v1))
    with pytest.raises(ShardError, match="shard-0000.*int32, manifest says uint16"):
        PackedLoader(LoaderConfig(str(tmp_path / "int32"), 16, 16)).next_global_batch()
    with pytest.raises(ValueError, match="do not fit uint16"):
        write_shard(tmp_path / "x.tar", [(np.full((1, 4), 70000, np.int32), np.zeros(0, np.int64))], None, "uint16")
    shutil.rmtree(tmp_path / "int32")
