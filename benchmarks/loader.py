#!/usr/bin/env python
"""Tokens/s delivered by PackedLoader (one process) vs reading the same tokens from a raw numpy memmap.

    python benchmarks/loader.py                       # embedded corpus, prepared into a temporary directory
    python benchmarks/loader.py --data DIR --seq-length 1024 --global-batch 256 --epochs 3

Both sides deliver int64 torch batches of the same rows: the raw side from one .npy memmap of all rows (read in
order, and in a shuffled row order), the loader side from the webdataset shards (validated, shuffled, with
document ids). The goal is loader >= 0.5x raw.
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


def raw_memmap(manifest: Manifest, path: Path) -> np.memmap:
    rows = [read_shard(manifest.shard_url(s.name), s, manifest.seq_length, manifest.tokenizer["pad_id"])[0]
            for s in manifest.shards]
    np.save(path, np.concatenate(rows))
    return np.load(path, mmap_mode="r")


def time_raw(mm: np.memmap, gbs: int, batches: int, shuffled: bool) -> float:
    n = len(mm)
    order = np.random.default_rng(0).permutation(n) if shuffled else None
    start, tokens = time.perf_counter(), 0
    for b in range(batches):
        lo = (b * gbs) % n
        idx = np.arange(lo, lo + gbs) % n
        rows = mm[np.sort(order[idx])] if shuffled else (mm[lo:lo + gbs] if lo + gbs <= n else mm[idx])
        tokens += torch.from_numpy(rows.astype(np.int64)).numel()
    return tokens / (time.perf_counter() - start)


def time_loader(path: str, gbs: int, batches: int, prefetch: bool) -> float:
    loader = PackedLoader(LoaderConfig(path, gbs, gbs, prefetch=prefetch))
    start, tokens = time.perf_counter(), 0
    for _ in range(batches):
        tokens += sum(mb["tokens"].numel() for mb in loader.next_global_batch())
    loader.close()
    return tokens / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="a prepared dataset (default: prepare the embedded corpus)")
    p.add_argument("--seq-length", type=int, default=512)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--epochs", type=float, default=3.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None:
            from mlmclm.data.prepare import prepare_embedded_corpus

            data = str(Path(tmp) / "data")
            prepare_embedded_corpus(data, args.seq_length, samples_per_shard=1024, progress=False)
        manifest = Manifest.load(data)
        mm = raw_memmap(manifest, Path(tmp) / "raw.npy")
        batches = max(1, int(args.epochs * manifest.num_samples / args.global_batch))
        time_loader(data, args.global_batch, 2, prefetch=False)   # warm the page cache and imports
        time_raw(mm, args.global_batch, 2, shuffled=False)
        raw_seq = time_raw(mm, args.global_batch, batches, shuffled=False)
        raw_shuf = time_raw(mm, args.global_batch, batches, shuffled=True)
        loaders = {p: time_loader(data, args.global_batch, batches, prefetch=p) for p in (False, True)}
    print(f"cores: {os.cpu_count()}  rows: {manifest.num_samples} x {manifest.seq_length}  "
          f"shards: {len(manifest.shards)}  global batch: {args.global_batch}  batches: {batches}")
    print(f"raw memmap, in order        : {raw_seq / 1e6:8.1f} M tokens/s")
    print(f"raw memmap, shuffled        : {raw_shuf / 1e6:8.1f} M tokens/s")
    for prefetch, loader in loaders.items():
        print(f"PackedLoader, prefetch={prefetch!s:5}: {loader / 1e6:8.1f} M tokens/s   "
              f"({loader / raw_seq:.2f}x raw in order, {loader / raw_shuf:.2f}x raw shuffled)")


if __name__ == "__main__":
    main()
