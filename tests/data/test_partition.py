import json
import os
import shutil
import zipfile

import pytest
from data_fixtures import write_jsonl

import tools.prepare_data as cli
from mlmclm.data.loader import LoaderConfig, PackedLoader
from mlmclm.data.manifest import Manifest
from mlmclm.data.partition import MergeError, merge
from mlmclm.data.prepare import PrepareConfig, prepare
from mlmclm.data.shards import read_shard


def cfg(inputs, out, tok_dir, **kw):
    kw = {"seq_length": 32, "samples_per_shard": 40, "rows_per_block": 16, "workers": 1, "progress": False,
          "group_docs": 23, **kw}
    return PrepareConfig(inputs=[str(i) for i in inputs], output_dir=str(out), tokenizer=str(tok_dir), **kw)


def rows_of(path) -> list[tuple]:
    """Every row of a dataset with its document ids, as a sorted list (a multiset)."""
    m = Manifest.load(path)
    rows = []
    for s in m.shards:
        tokens, docs = read_shard(m.shard_url(s.name), s, m.seq_length, m.tokenizer["pad_id"], m.dtype)
        rows.extend(zip(map(tuple, tokens.tolist()), map(tuple, docs.tolist())))
    return sorted(rows)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, tok_dir, docs):
    """The corpus in two files, prepared once in one run and once as 3 partitions merged."""
    root = tmp_path_factory.mktemp("partition")
    inputs = [write_jsonl(root / "a.jsonl", docs[:150]), write_jsonl(root / "b.jsonl", docs[150:])]
    single = prepare(cfg(inputs, root / "single", tok_dir))
    parts = [prepare(cfg(inputs, root / "merged", tok_dir, partition=i, num_partitions=3, workers=1 + (i == 1)))
             for i in range(3)]
    return root, inputs, single, parts


def test_three_partitions_merged_hold_exactly_the_rows_of_one_run(prepared, tok_dir):
    root, _, single, parts = prepared
    assert [p.partition["index"] for p in parts] == [0, 1, 2]
    assert all(p.num_samples > 0 and p.tails["groups"] > 0 for p in parts)
    merged = merge(root / "merged")
    assert rows_of(root / "merged") == rows_of(root / "single")
    assert merged.num_samples == single.num_samples and merged.num_tokens == single.num_tokens
    assert merged.num_documents == single.num_documents == 400
    assert merged.parts == ["part-00000-of-00003", "part-00001-of-00003", "part-00002-of-00003"]
    assert any(s.name.startswith("tails-") for s in merged.shards)
    # Grouping leaves at most one padded row in all (the last), as without groups.
    pad = single.tokenizer["pad_id"]
    padded = [row for row, _ in rows_of(root / "single") if pad in row]
    assert len(padded) <= 1
    # The merged dataset trains like any other: the loader reads every row once per epoch.
    loader = PackedLoader(LoaderConfig(str(root / "merged"), merged.num_samples, merged.num_samples))
    tokens = loader.next_global_batch()[0]["tokens"].numpy()
    assert sorted(map(tuple, tokens.tolist())) == sorted(r for r, _ in rows_of(root / "single"))
    # With one group, the grouped packing is the plain one: byte-identical to a run with the default grouping.
    one = prepare(cfg([root / "a.jsonl"], root / "one_group", tok_dir, group_docs=150))
    default = prepare(cfg([root / "a.jsonl"], root / "default", tok_dir, group_docs=100_000))
    assert one.shards == default.shards


@pytest.mark.timeout(180)
def test_merge_refuses_mismatched_or_damaged_parts(prepared, tmp_path, tok_dir, docs, capsys):
    root, inputs, _, _ = prepared
    work = tmp_path / "work"
    shutil.copytree(root / "merged", work)
    (work / "manifest.json").unlink(missing_ok=True)
    part1 = work / "part-00001-of-00003"

    def refused(pattern, parts=None):
        with pytest.raises(MergeError, match=pattern):
            merge(work, parts)
        assert not (work / "manifest.json").exists()

    # Another tokenizer.
    from mlmclm.data.tokenizer import train_bpe

    train_bpe(docs[:100], 280, tmp_path / "other-tok")
    saved = tmp_path / "saved"
    shutil.copytree(part1, saved)
    prepare(cfg(inputs, work, tmp_path / "other-tok", partition=1, num_partitions=3))
    refused("part-00001-of-00003.*tokenizer mismatch")
    # Another sequence length.
    prepare(cfg(inputs, work, tok_dir, partition=1, num_partitions=3, seq_length=16))
    refused("part-00001-of-00003: seq_length is 16")
    # Another grouping.
    prepare(cfg(inputs, work, tok_dir, partition=1, num_partitions=3, group_docs=10))
    refused("part-00001-of-00003: partition group_docs is 10")
    shutil.rmtree(part1)
    shutil.copytree(saved, part1)
    # A corrupt shard, named.
    shard = part1 / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    data[2000] ^= 0x5A
    shard.write_bytes(bytes(data))
    refused("part-00001-of-00003.*shard-000000.tar.*checksum")
    shutil.copy(saved / "shard-000000.tar", shard)
    # Damaged tails.
    m = json.loads((part1 / "manifest.json").read_text())
    m["tails"]["checksum"] += 1
    (part1 / "manifest.json").write_text(json.dumps(m))
    refused("part-00001-of-00003.*tails.npz does not match")
    shutil.copy(saved / "manifest.json", part1 / "manifest.json")
    # Tails that are a FIFO (the old merge blocked on it), or a small file that unpacks to far more than its
    # manifest counts (a compressed member of 64 MiB: the old merge decompressed it whole).
    tails = part1 / "tails.npz"
    tails.unlink()
    os.mkfifo(tails)
    refused(f"part-00001-of-00003.*{tails}: refusing to read this tails file: it is a FIFO")
    tails.unlink()
    with zipfile.ZipFile(tails, "w", zipfile.ZIP_DEFLATED) as bomb:
        bomb.writestr("tokens.npy", bytes(64 << 20))
    assert tails.stat().st_size < 1 << 20
    refused(f"{tails}: refusing to read this tails file: its arrays unpack to 67108864 bytes, more than the")
    shutil.copy(saved / "tails.npz", tails)
    # A missing part.
    refused(r"missing \[1\]", [work / "part-00000-of-00003", work / "part-00002-of-00003"])
    # Not a part at all.
    refused("not a partition", [root / "single"])
    # All good again; through the CLI.
    assert cli.main(["merge", str(work)]) == 0
    assert rows_of(work) == rows_of(root / "single")
    assert cli.main(["merge", str(tmp_path / "nothing")]) == 2
    assert "no part-*-of-* directories" in capsys.readouterr().err


def test_cli_partition_from_slurm_array(tmp_path, tok_dir, docs, monkeypatch, capsys):
    src = write_jsonl(tmp_path / "a.jsonl", docs[:60])
    args = ["--input", str(src), "--output", str(tmp_path / "out"), "--tokenizer", str(tok_dir), "--seq-length",
            "32", "--workers", "1", "--no-progress", "--num-partitions", "2", "--group-docs", "10"]
    for task in ("0", "1"):
        monkeypatch.setenv("SLURM_ARRAY_TASK_ID", task)
        assert cli.main(args + ["--partition", "slurm"]) == 0
    assert cli.main(["merge", str(tmp_path / "out")]) == 0
    assert Manifest.load(tmp_path / "out").num_documents == 60
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID")
    with pytest.raises(SystemExit):
        cli.main(args + ["--partition", "slurm"])
    assert "SLURM_ARRAY_TASK_ID is not set" in capsys.readouterr().err
    with pytest.raises(Exception, match="partition 2 is not in"):
        prepare(cfg([src], tmp_path / "x", tok_dir, partition=2, num_partitions=2))


def test_the_validation_split_is_the_same_from_one_run_or_merged_partitions(tmp_path, tok_dir, docs):
    """`validation_every`: every K-th document is kept out of the training rows and packed into OUTPUT/validation,
    which the manifest records; partitions merged give the same training rows and the same split as one run."""
    inputs = [write_jsonl(tmp_path / "a.jsonl", docs[:150]), write_jsonl(tmp_path / "b.jsonl", docs[150:])]
    single = prepare(cfg(inputs, tmp_path / "single", tok_dir, validation_every=8))
    for i in range(3):
        prepare(cfg(inputs, tmp_path / "merged", tok_dir, partition=i, num_partitions=3, validation_every=8))
    merged = merge(tmp_path / "merged")
    plain = prepare(cfg(inputs, tmp_path / "plain", tok_dir))
    assert single.validation["path"] == merged.validation["path"] == "validation/manifest.json"
    assert single.validation["num_documents"] == merged.validation["num_documents"] == 50   # 400 / 8
    assert single.num_documents == merged.num_documents == 350
    assert rows_of(tmp_path / "merged") == rows_of(tmp_path / "single")
    assert rows_of(tmp_path / "merged" / "validation") == rows_of(tmp_path / "single" / "validation")
    held_out = Manifest.load(tmp_path / "single" / "validation")
    assert held_out.num_tokens + single.num_tokens == plain.num_tokens   # every token once, in one split or the other
    with pytest.raises(Exception, match="validation_every"):
        prepare(cfg(inputs[:1], tmp_path / "tiny", tok_dir, validation_every=1))
