import logging
import shutil
import tarfile

import numpy as np
import pytest
import torch

from mlmclm.data.loader import LoaderConfig, PackedLoader
from mlmclm.data.manifest import Manifest
from mlmclm.data.shards import ShardError


def stream(path, n_batches, gbs, mbs, dp, seed=1234, **kw):
    """The global sample stream (tokens, sample ids) as all DP ranks together see it."""
    loaders = [PackedLoader(LoaderConfig(str(path), gbs, mbs, seed=seed, **kw), r, dp) for r in range(dp)]
    tokens, ids = [], []
    for _ in range(n_batches):
        for loader in loaders:               # rank order = slice order of the global batch
            for mb in loader.next_global_batch():
                assert mb["tokens"].shape == (mbs, 32) and mb["tokens"].dtype == torch.int64
                assert mb["document_ids"].shape == (mbs, 32) and mb["sample_ids"].shape == (mbs,)
                tokens.append(mb["tokens"])
                ids.append(mb["sample_ids"])
    return torch.cat(tokens), torch.cat(ids)


def test_same_stream_for_any_dp_and_micro_batch(dataset):
    ref_tokens, ref_ids = stream(dataset, 12, 16, 16, 1)
    assert torch.equal(ref_ids, torch.arange(12 * 16))
    for dp, mbs in [(1, 4), (2, 8), (2, 1), (4, 4), (4, 2)]:
        tokens, ids = stream(dataset, 12, 16, mbs, dp)
        assert torch.equal(ids, ref_ids) and torch.equal(tokens, ref_tokens), (dp, mbs)
    other, _ = stream(dataset, 12, 16, 16, 1, seed=99)
    assert not torch.equal(other, ref_tokens)


def test_rank_slices_and_micro_batch_count(dataset):
    loader = PackedLoader(LoaderConfig(str(dataset), 24, 3), dp_rank=1, dp_size=2)
    batches = loader.next_global_batch()
    assert len(batches) == 24 // (3 * 2)
    assert torch.cat([b["sample_ids"] for b in batches]).tolist() == list(range(12, 24))
    assert loader.consumed_samples == 24
    with pytest.raises(ValueError, match="not a multiple"):
        PackedLoader(LoaderConfig(str(dataset), 24, 5), dp_size=2)


def test_resume_mid_epoch_continues_with_next_sample(dataset):
    cfg = LoaderConfig(str(dataset), 16, 4)
    a = PackedLoader(cfg)
    for _ in range(7):
        a.next_global_batch()
    state = a.state_dict()
    assert all(isinstance(v, (int, str)) for v in state.values())
    expected = [a.next_global_batch() for _ in range(3)]
    for restored_state in (state, {"consumed_samples": state["consumed_samples"]}):  # full, or the counter only
        b = PackedLoader(cfg, dp_rank=0, dp_size=1)
        b.load_state_dict(restored_state)
        for want in expected:
            got = b.next_global_batch()
            for g, w in zip(got, want):
                assert all(torch.equal(g[k], w[k]) for k in ("tokens", "sample_ids", "document_ids"))
    # Resuming must not re-read shards it has passed: only the shard of the next sample is loaded.
    c = PackedLoader(LoaderConfig(str(dataset), 16, 4, prefetch=False))
    c.load_state_dict(state)
    reads = []
    original = c._read
    c._read = lambda shard, epoch: reads.append(shard) or original(shard, epoch)
    c.next_global_batch()
    assert len(reads) == 1
    with pytest.raises(ValueError, match="seed"):
        PackedLoader(LoaderConfig(str(dataset), 16, 4, seed=1)).load_state_dict(state)


def test_epochs_wrap_deterministically(dataset, caplog):
    n = Manifest.load(dataset).num_samples        # 2,679 rows: epochs end inside a global batch
    gbs = 64
    steps = (3 * n) // gbs
    with caplog.at_level(logging.INFO, logger="mlmclm.data.loader"):
        tokens, ids = stream(dataset, steps, gbs, 16, 2)
    assert sum("starting epoch" in r.message for r in caplog.records) >= 2 * 2   # two wraps, on each rank
    assert torch.equal(ids, torch.arange(steps * gbs))
    again, _ = stream(dataset, steps, gbs, 32, 1)
    assert torch.equal(tokens, again)
    # Each epoch visits every row once, in a different order.
    rows = [tokens[e * n:(e + 1) * n] for e in range(2)]
    m = Manifest.load(dataset)
    from mlmclm.data.shards import read_shard
    everything = np.concatenate([read_shard(m.shard_url(s.name), s, 32, m.tokenizer["pad_id"])[0] for s in m.shards])
    assert sorted(map(tuple, rows[0].tolist())) == sorted(map(tuple, everything.tolist()))
    assert not torch.equal(rows[0], rows[1])
    assert sorted(map(tuple, rows[0].tolist())) == sorted(map(tuple, rows[1].tolist()))


def test_document_ids_follow_bos(dataset):
    loader = PackedLoader(LoaderConfig(str(dataset), 64, 64))
    mb = loader.next_global_batch()[0]
    bos = loader.manifest.tokenizer["bos_id"]
    starts = mb["tokens"] == bos
    starts[:, 0] = False
    assert torch.equal(mb["document_ids"], starts.long().cumsum(1))


def test_pipe_url(dataset):
    local, _ = stream(dataset, 3, 16, 4, 1)
    piped, _ = stream(f"pipe:cat {dataset}/manifest.json", 3, 16, 4, 1)
    assert torch.equal(local, piped)


def _copy(dataset, tmp_path):
    out = tmp_path / "ds"
    shutil.copytree(dataset, out)
    return out, Manifest.load(out)


def test_a_shard_the_os_cannot_read_is_named_with_the_oss_words(dataset, tmp_path):
    """An I/O error while loading (here a missing file) names the shard and carries the OS's own message, as a failed
    save does (issue 35); a directory where the shard should be is refused naming what it is (issue 44)."""
    out, m = _copy(dataset, tmp_path)
    path = out / m.shards[PackedLoader(LoaderConfig(str(out), 16, 16))._order(0)[0][0]].name
    path.unlink()
    with pytest.raises(ShardError, match=rf"{path.name}: unreadable.*No such file or directory"):
        PackedLoader(LoaderConfig(str(out), 16, 16)).next_global_batch()
    path.mkdir()
    with pytest.raises(ShardError, match=rf"{path.name}: refusing to read this shard: it is a directory"):
        PackedLoader(LoaderConfig(str(out), 16, 16)).next_global_batch()


def test_truncated_or_corrupt_shard_is_named(dataset, tmp_path, caplog):
    out, m = _copy(dataset, tmp_path)
    first = PackedLoader(LoaderConfig(str(out), 16, 16))
    first_shard = first._order(0)[0][0]
    name = m.shards[first_shard].name
    path = out / name
    path.write_bytes(path.read_bytes()[:3000])            # truncated
    with pytest.raises(ShardError, match=name):
        PackedLoader(LoaderConfig(str(out), 16, 16)).next_global_batch()

    shutil.copy(dataset / name, path)
    with tarfile.open(path) as tar:
        offset = next(t.offset_data for t in tar.getmembers() if t.name.endswith("tokens.npy"))
    data = bytearray(path.read_bytes())
    data[offset + 128 + 40] ^= 0x5A                         # flip bits inside the first block's tokens
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=f"{name}.*checksum"):
        PackedLoader(LoaderConfig(str(out), 16, 16)).next_global_batch()

    # skip_corrupt: a warning naming the shard, counted, and the stream goes on with the next shard.
    with caplog.at_level(logging.WARNING, logger="mlmclm.data.loader"):
        loader = PackedLoader(LoaderConfig(str(out), 16, 16, skip_corrupt=True))
        batch = loader.next_global_batch()
    assert any(name in r.message and "1 skipped" in r.message for r in caplog.records)
    assert loader.skipped_shards == [name] and loader.state_dict()["skipped_shards"] == name
    assert batch[0]["tokens"].shape == (16, 32)


def test_manifest_checks(dataset, tmp_path):
    from mlmclm.data.tokenizer import check_same_tokenizer  # noqa: F401 (the check the loader uses)

    m = Manifest.load(dataset)
    wrong = dict(m.tokenizer, vocab_hash="0" * 64, name="other")
    with pytest.raises(ValueError, match="tokenizer mismatch.*vocab_hash"):
        PackedLoader(LoaderConfig(str(dataset), 16, 16), expected_tokenizer=wrong)
    PackedLoader(LoaderConfig(str(dataset), 16, 16), expected_tokenizer=m.tokenizer)

    out, m = _copy(dataset, tmp_path)
    m.seq_length = 64                                     # the shards hold rows of 32
    m.save(out)
    with pytest.raises(ShardError, match="sequence length"):
        PackedLoader(LoaderConfig(str(out), 16, 16)).next_global_batch()
    m.seq_length = 32
    m.shards[0].num_samples += 1
    m.save(out)
    with pytest.raises(ValueError, match="do not add up"):
        PackedLoader(LoaderConfig(str(out), 16, 16))
    with pytest.raises(ValueError, match="cannot read dataset manifest"):
        PackedLoader(LoaderConfig(str(tmp_path / "nowhere"), 16, 16))


def test_rows_are_shuffled_within_and_across_shards(dataset):
    tokens, _ = stream(dataset, 1, 64, 64, 1)
    m = Manifest.load(dataset)
    first = np.asarray(tokens[:2])
    assert not np.array_equal(first[0, :5], first[1, :5])
    assert m.num_samples > 64


def test_cache_bound_and_prefetch_do_not_change_the_stream(dataset):
    n = Manifest.load(dataset).num_samples
    steps = (2 * n) // 64 + 1                              # into a third epoch
    ref, _ = stream(dataset, steps, 64, 16, 1)
    for kw in ({"cache_bytes": 0}, {"cache_bytes": 0, "prefetch": False}, {"cache_bytes": 40_000},
               {"prefetch": False}):
        for dp in (1, 2):
            tokens, _ = stream(dataset, steps, 64, 16, dp, **kw)
            assert torch.equal(tokens, ref), (kw, dp)
    with pytest.raises(ValueError, match="cache_bytes"):
        LoaderConfig(str(dataset), 16, 16, cache_bytes=-1)


def _counting_reads(loader):
    reads = []
    original = loader._read
    loader._read = lambda shard, epoch: reads.append(shard) or original(shard, epoch)
    return reads


def test_shards_are_read_once_when_they_fit_and_again_when_not(dataset):
    m = Manifest.load(dataset)
    epochs = 3
    steps = epochs * m.num_samples // 64
    cached = PackedLoader(LoaderConfig(str(dataset), 64, 64, prefetch=False))
    reads = _counting_reads(cached)
    for _ in range(steps):
        cached.next_global_batch()
    assert sorted(reads) == list(range(len(m.shards)))      # every shard decoded and validated once
    streaming = PackedLoader(LoaderConfig(str(dataset), 64, 64, prefetch=False, cache_bytes=0))
    reads = _counting_reads(streaming)
    for _ in range(steps):
        streaming.next_global_batch()
    assert len(reads) >= (epochs - 1) * len(m.shards)        # bounded: re-read (and re-validated) each epoch
    assert len(streaming._cache) <= 2


def test_batches_are_fresh_arrays(dataset):
    """Mutating a delivered batch (e.g. masking in place) must not change later batches or epochs."""
    n = Manifest.load(dataset).num_samples
    steps = n // 16 + 1
    ref, _ = stream(dataset, 2 * steps, 16, 16, 1)
    loader = PackedLoader(LoaderConfig(str(dataset), 16, 16))
    got = []
    for _ in range(2 * steps):
        mb = loader.next_global_batch()[0]
        got.append(mb["tokens"].clone())
        mb["tokens"].fill_(-1)
        mb["document_ids"].fill_(-1)
    assert torch.equal(torch.cat(got), ref)


def test_corrupt_shard_found_on_first_read_with_cache(dataset, tmp_path):
    """The cache keeps validated shards only: corruption is reported when a shard is first read, also when it is
    not the first shard of the epoch."""
    out, m = _copy(dataset, tmp_path)
    loader = PackedLoader(LoaderConfig(str(out), 16, 16))
    order, ends = loader._order(0)
    name = m.shards[order[1]].name                          # the second shard of epoch 0
    path = out / name
    with tarfile.open(path) as tar:
        offset = next(t.offset_data for t in tar.getmembers() if t.name.endswith("tokens.npy"))
    data = bytearray(path.read_bytes())
    data[offset + 128 + 40] ^= 0x5A
    path.write_bytes(bytes(data))
    for _ in range(int(ends[0]) // 16):                      # the first shard: fine
        loader.next_global_batch()
    with pytest.raises(ShardError, match=f"{name}.*checksum"):
        for _ in range(int(ends[1] - ends[0]) // 16 + 1):
            loader.next_global_batch()


def _plant_token(out, m, shard: int, row: int, col: int, token: int):
    """Rewrite shard `shard` of the dataset copy `out` with one id replaced, its manifest entry updated to match
    (counts and checksum consistent): only the id range tells it apart."""
    from mlmclm.data.shards import read_shard_starts, write_shard

    info = m.shards[shard]
    tokens, starts = read_shard_starts(str(out / info.name), info, m.seq_length, m.tokenizer["pad_id"], m.dtype)
    tokens = np.array(tokens, dtype=np.int32 if token < 0 else tokens.dtype)
    tokens[row, col] = token
    new = write_shard(out / info.name, [(tokens, np.array(starts))], m.tokenizer["pad_id"],
                      "int32" if token < 0 else m.dtype)
    m.shards[shard] = new
    if token < 0:
        m.dtype = "int32"
    m.save(out)
    return info.name


def test_token_ids_outside_the_vocabulary_are_refused_naming_shard_and_id(dataset, tmp_path, caplog):
    """A shard whose counts and checksum agree with its manifest but holds an id >= vocab_size: the old loader
    handed it out (it failed only in the embedding, on every rank). Now a ShardError naming the shard, the id and
    its place; skip_corrupt skips it like any other corrupt shard."""
    out, m = _copy(dataset, tmp_path)
    first = PackedLoader(LoaderConfig(str(out), 16, 16))._order(0)[0][0]
    vocab = m.tokenizer["vocab_size"]
    name = _plant_token(out, m, first, 3, 5, vocab + 7)
    with pytest.raises(ShardError, match=rf"{name}: token id {vocab + 7} \(row 3, column 5\) is outside the "
                                         rf"vocabulary \[0, {vocab}\)"):
        PackedLoader(LoaderConfig(str(out), 16, 16)).next_global_batch()
    with caplog.at_level(logging.WARNING, logger="mlmclm.data.loader"):
        loader = PackedLoader(LoaderConfig(str(out), 16, 16, skip_corrupt=True))
        batches = [loader.next_global_batch()[0]["tokens"] for _ in range(m.num_samples // 16)]
    assert loader.skipped_shards == [name]
    assert any(name in r.message and f"token id {vocab + 7}" in r.message for r in caplog.records)
    assert int(torch.cat(batches).max()) < vocab

    out2, m2 = _copy(dataset, tmp_path / "negative")       # int32 data: a negative id too
    name = _plant_token(out2, m2, first, 0, 0, -2)
    with pytest.raises(ShardError, match=rf"{name}: token id -2 \(row 0, column 0\) is outside"):
        PackedLoader(LoaderConfig(str(out2), 16, 16)).next_global_batch()


def test_a_manifest_without_a_vocabulary_size_is_refused(dataset, tmp_path):
    out, m = _copy(dataset, tmp_path)
    m.tokenizer.pop("vocab_size")
    m.save(out)
    with pytest.raises(ValueError, match="tokenizer.vocab_size None is not a positive integer"):
        PackedLoader(LoaderConfig(str(out), 16, 16))
