#!/usr/bin/env python
"""Tokens/s delivered by PackedLoader (one process) vs reading the same tokens from a raw numpy memmap.

    python benchmarks/loader.py                       # embedded corpus, prepared into a temporary directory
    python benchmarks/loader.py --data DIR --seq-length 1024 --global-batch 256 --epochs 3

Token storage: with the embedded corpus (8192-id vocabulary) the dataset is prepared twice, with uint16 tokens
(the default when the vocabulary fits) and with int32 tokens; shard bytes are printed for both and the loader
runs on both, interleaved with the other sides ("PackedLoader int32 ...").

What each side does, per global batch of G rows (one micro-batch of G rows, one process):

* raw, in order, tokens            -- a slice of G consecutive rows of one .npy memmap of every row (int32),
                                      converted to an int64 torch tensor; plus sample ids. No shuffling: a
                                      reference only, a trainer may not read in order.
* raw, loader order, tokens        -- the same G rows, in the same order, as the loader delivers, gathered from the
                                      memmap by row index and converted to int64 torch; plus sample ids. (Index
                                      arrays are computed before timing.)
* raw, loader order, tokens+doc ids -- as above, plus document ids gathered from an int16 [N, S] memmap (the form
                                      the loader caches) and converted to int64: the same three tensors as the
                                      loader. The benchmark checks the first batches are equal to the loader's.
* PackedLoader                     -- `next_global_batch()` from the webdataset shards: tokens, document ids
                                      (int64 [G, S]) and sample ids (int64 [G]); every shard is validated (checksum,
                                      counts) when read. A fresh loader, so the first epoch's shard reads, validation
                                      and decoding are timed too. With the default cache (here the whole dataset stays
                                      decoded after its first read) and with cache_bytes=0 (only the shards in use and
                                      the prefetched one are kept, so every shard is read and validated again each
                                      epoch, as on a dataset much larger than the cache).

The goal is loader >= 0.5x "raw, loader order, tokens+doc ids". That is the fair baseline: the loader must
shuffle, so a raw reader would have to gather the same shuffled rows (gathering random rows is ~1.5-2x slower than
slicing consecutive ones), and it must deliver the same tensors. "tokens only" and "in order" are printed for
reference, and the ratios against them too. (An earlier version of this benchmark sorted each batch's shuffled
indices on the raw side and compared against in-order reading with tokens only.)

Timing: the sides take turns, `--chunk` batches each, so that load changes on a shared machine hit every side
alike. "median" is the median over chunks of the chunk's tokens/s (robust to another process taking the core for
a while; one-off costs such as a shard read fall in few chunks and hardly move it), "total" is all tokens over all
time (includes those one-off costs and any preemption). Ratios use the medians.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from mlmclm.data.loader import LoaderConfig, PackedLoader
from mlmclm.data.manifest import Manifest
from mlmclm.data.shards import read_shard


def raw_memmaps(manifest: Manifest, tmp: Path) -> tuple[np.memmap, np.memmap]:
    """Every row of the dataset, shards in manifest order: tokens int32 [N, S] and document ids int16 [N, S] (the
    compact form the loader keeps too), as .npy memmaps."""
    tokens, docs = [], []
    for s in manifest.shards:
        t, d = read_shard(manifest.shard_url(s.name), s, manifest.seq_length, manifest.tokenizer["pad_id"])
        tokens.append(t)
        docs.append(d.astype(np.int16))
    np.save(tmp / "tokens.npy", np.concatenate(tokens))
    np.save(tmp / "docs.npy", np.concatenate(docs))
    return np.load(tmp / "tokens.npy", mmap_mode="r"), np.load(tmp / "docs.npy", mmap_mode="r")


def loader_rows(data: str, manifest: Manifest, n: int, seed: int) -> np.ndarray:
    """Memmap row indices of the loader's first n stream samples (its shard and row orders, epoch after epoch)."""
    offsets = np.cumsum([0] + [s.num_samples for s in manifest.shards])
    probe = PackedLoader(LoaderConfig(data, 1, 1, seed=seed, prefetch=False))
    parts, total, epoch = [], 0, 0
    while total < n:
        for shard in probe._order(epoch)[0]:   # the loader's own order (private helpers, on purpose)
            parts.append(offsets[shard] + probe._rows(int(shard), epoch))
            total += len(parts[-1])
        epoch += 1
    probe.close()
    return np.concatenate(parts)[:n]


def raw_batches(tokens: np.memmap, docs: np.memmap | None, gbs: int, rows: np.ndarray | None):
    """Endless raw global batches: rows in order (rows=None) or the given rows; tokens (and document ids) as int64
    torch tensors, plus sample ids."""
    n, b = len(tokens), 0
    while True:
        if rows is not None:
            idx = rows[b * gbs:(b + 1) * gbs]
        else:
            lo = (b * gbs) % n
            idx = slice(lo, lo + gbs) if lo + gbs <= n else np.arange(lo, lo + gbs) % n
        batch = {"tokens": torch.from_numpy(tokens[idx].astype(np.int64)),
                 "sample_ids": torch.from_numpy(np.arange(b * gbs, (b + 1) * gbs, dtype=np.int64))}
        if docs is not None:
            batch["document_ids"] = torch.from_numpy(docs[idx].astype(np.int64))
        yield batch
        b += 1


def loader_batches(path: str, gbs: int, seed: int, **kw):
    """Endless global batches of a fresh PackedLoader (created when first asked, so its first shard reads count)."""
    loader = PackedLoader(LoaderConfig(path, gbs, gbs, seed=seed, **kw))
    try:
        while True:
            yield loader.next_global_batch()[0]
    finally:
        loader.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="a prepared dataset (default: prepare the embedded corpus)")
    p.add_argument("--seq-length", type=int, default=512)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--chunk", type=int, default=20, help="batches per timed chunk (sides take turns per chunk)")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args()
    gbs = args.global_batch
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None:
            from mlmclm.data.prepare import prepare_embedded_corpus

            data = str(Path(tmp) / "data")
            prepare_embedded_corpus(data, args.seq_length, samples_per_shard=1024, progress=False)
            data32 = str(Path(tmp) / "data_int32")
            prepare_embedded_corpus(data32, args.seq_length, samples_per_shard=1024, progress=False,
                                    token_dtype="int32")
        else:
            data32 = None
        manifest = Manifest.load(data)
        tokens, docs = raw_memmaps(manifest, Path(tmp))
        batches = max(1, int(args.epochs * manifest.num_samples / gbs))
        rows = loader_rows(data, manifest, batches * gbs, args.seed)

        # Same rows, same order, same tensors: check the first batches of the raw "loader order" side.
        for b, (want, got) in enumerate(zip(raw_batches(tokens, docs, gbs, rows),
                                            loader_batches(data, gbs, args.seed, prefetch=False))):
            assert all(torch.equal(want[k], got[k]) for k in want), f"batch {b} differs"
            if b == 2:
                break
        for _ in zip(range(2), raw_batches(tokens, docs, gbs, rows)):   # warm the page cache and allocator
            pass

        sides = {
            "raw, in order, tokens": raw_batches(tokens, None, gbs, None),
            "raw, loader order, tokens": raw_batches(tokens, None, gbs, rows),
            "raw, loader order, tokens+doc ids": raw_batches(tokens, docs, gbs, rows),
        }
        for cache in ("default", 0):
            for prefetch in (False, True):
                kw = {"prefetch": prefetch} | ({} if cache == "default" else {"cache_bytes": cache})
                sides[f"PackedLoader cache={cache!s:7} prefetch={prefetch!s:5}"] = \
                    loader_batches(data, gbs, args.seed, **kw)
                if data32 is not None and prefetch:
                    sides[f"PackedLoader int32 cache={cache!s:7} prefetch={prefetch!s:5}"] = \
                        loader_batches(data32, gbs, args.seed, **kw)
        # Take turns, a chunk of batches each, so that load changes on a shared machine hit every side alike.
        seconds, tokens_seen = dict.fromkeys(sides, 0.0), dict.fromkeys(sides, 0)
        chunks = {name: [] for name in sides}
        done = 0
        while done < batches:
            n = min(args.chunk, batches - done)
            for name, it in sides.items():
                start = time.perf_counter()
                for _ in range(n):
                    tokens_seen[name] += next(it)["tokens"].numel()
                seconds[name] += time.perf_counter() - start
                chunks[name].append((time.perf_counter() - start) / n)
            done += n
        for it in sides.values():
            it.close()
        storage = {}   # token dtype -> (shard bytes, token positions)
        for d in filter(None, (data, data32)):
            m = Manifest.load(d)
            storage[m.dtype] = (sum(Path(m.shard_url(s.name)).stat().st_size for s in m.shards),
                                m.num_samples * m.seq_length)
    total = {name: tokens_seen[name] / seconds[name] for name in sides}
    median = {name: args.global_batch * manifest.seq_length / float(np.median(c)) for name, c in chunks.items()}
    load = os.getloadavg()
    print(f"cores: {os.cpu_count()} (usable {len(os.sched_getaffinity(0))}, load avg {load[0]:.1f})  "
          f"torch threads: {torch.get_num_threads()}  rows: {manifest.num_samples} x {manifest.seq_length}  "
          f"shards: {len(manifest.shards)}  global batch: {gbs}  batches: {batches} (chunks of {args.chunk})")
    for dtype, (size, positions) in storage.items():
        print(f"shard bytes ({dtype} tokens): {size / 1e6:.1f} MB = {size / positions:.2f} bytes per token position")
    print(f"{'M tokens/s':>53} {'':>9} | ratios of the median rate (goal: 1st >= 0.5)")
    print(f"{'':42}  {'median':>9} {'total':>9} | vs same output, tokens only, in order")
    fair, raw_tokens, raw_seq = (median[k] for k in ("raw, loader order, tokens+doc ids",
                                                     "raw, loader order, tokens", "raw, in order, tokens"))
    for name in sides:
        line = f"{name:42}: {median[name] / 1e6:9.1f} {total[name] / 1e6:9.1f}"
        if name.startswith("PackedLoader"):
            line += f" | {median[name] / fair:5.2f}x {median[name] / raw_tokens:5.2f}x {median[name] / raw_seq:5.2f}x"
        print(line)

if __name__ == "__main__":
    main()
