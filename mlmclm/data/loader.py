"""Deterministic, resumable loader of packed shards into megatron micro-batches.

The global sample stream depends only on (seed, data): epoch e visits the shards in an order shuffled by
(seed, e) and the rows of each shard in an order shuffled by (seed, e, shard). Global batch k is stream positions
[k*G, (k+1)*G); DP rank r takes the contiguous slice [r*G/dp, (r+1)*G/dp) of it and cuts it into micro-batches.
So the samples and their order are the same for any DP size, TP/PP layout or micro-batch size with the same
global batch size G. `sample_ids` are stream positions (unique across epochs): MLM masking keys on them.

Each rank reads the shards its slices fall in. A shard is read whole and validated (checksum, counts, every token id
inside the manifest's vocabulary) on its first read, then kept decoded (tokens as stored, uint16 or int32; document
ids int16/int32) in a cache bounded by `LoaderConfig.cache_bytes`: the shards in use and the prefetched next one are
always kept, others are dropped least recently used first; a dropped shard is read and validated again when next
needed. With the whole dataset in the cache, later epochs read no files. The next shard of the epoch is prefetched
on a thread. A micro-batch costs one gather + int64 conversion per tensor into a fresh array (the caller owns what
it gets: nothing it receives aliases the cache or an earlier batch). Resuming jumps straight to the saved position
using the manifest's counts.
"""
from __future__ import annotations

import bisect
import logging
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from mlmclm.data.manifest import Manifest
from mlmclm.data.remote import InFlightReads
from mlmclm.data.shards import ShardError, document_ids, read_shard_starts
from mlmclm.data.tokenizer import check_same_tokenizer, check_token_ids

log = logging.getLogger(__name__)
STATE_FORMAT = 1


@dataclass
class LoaderConfig:
    path: str                  # dataset directory, manifest file, or manifest URL (pipe:..., http(s)://...)
    global_batch_size: int
    micro_batch_size: int
    seed: int = 1234
    skip_corrupt: bool = False  # skip (with a warning, counted) instead of raising on a corrupt shard
    prefetch: bool = True
    # Decoded shards kept in memory (4 bytes per token for uint16 data, 6 for int32, when S <= 32768). The shards in use and the prefetched one
    # are kept even past the bound; 0 keeps only those (each shard is then re-read every epoch).
    cache_bytes: int = 1 << 30

    def __post_init__(self):
        if self.global_batch_size < 1 or self.micro_batch_size < 1:
            raise ValueError("global_batch_size and micro_batch_size must be positive")
        if self.seed < 0:
            raise ValueError(f"seed must be non-negative, got {self.seed}")
        if self.cache_bytes < 0:
            raise ValueError(f"cache_bytes must be non-negative, got {self.cache_bytes}")


def check_batch_split(global_batch_size: int, micro_batch_size: int, dp_rank: int, dp_size: int) -> None:
    """Every DP rank takes whole micro-batches of each global batch."""
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank {dp_rank} outside [0, {dp_size})")
    if global_batch_size % (micro_batch_size * dp_size):
        raise ValueError(f"global_batch_size {global_batch_size} is not a multiple of micro_batch_size "
                         f"{micro_batch_size} x dp_size {dp_size}")


class PackedLoader:
    def __init__(self, cfg: LoaderConfig, dp_rank: int = 0, dp_size: int = 1, expected_tokenizer: dict | None = None):
        check_batch_split(cfg.global_batch_size, cfg.micro_batch_size, dp_rank, dp_size)
        self.cfg, self.dp_rank, self.dp_size = cfg, dp_rank, dp_size
        self.manifest = Manifest.load(cfg.path)
        m = self.manifest
        if expected_tokenizer is not None:
            check_same_tokenizer(m.tokenizer, expected_tokenizer, where=m.location)
        if sum(s.num_samples for s in m.shards) != m.num_samples or m.num_samples == 0:
            raise ValueError(f"{m.location}: shard sample counts do not add up to num_samples={m.num_samples}")
        self._pad_id = m.tokenizer.get("pad_id")
        check_token_ids(m.tokenizer, m.location)   # at start: vocab_size and every special id inside it
        self._vocab_size = m.tokenizer["vocab_size"]   # every id handed out is checked against it
        self.epoch = 0
        self.consumed_samples = 0
        self._epoch_start = 0             # stream position where the current epoch began
        self._skipped: set[str] = set()   # corrupt shards skipped (skip_corrupt=True)
        self._order_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._order_lists_cache: tuple = (None, None)
        # shard index -> future of (tokens int32 [n, S], document ids int16/int32 [n, S]), least recently used first
        self._cache: OrderedDict[int, Future] = OrderedDict()
        self._cache_sizes: dict[int, int] = {}   # bytes of the cached shards that have been used (so are done)
        self._rows_cache: dict[tuple[int, int], np.ndarray] = {}  # (epoch, shard) -> row order
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="shard-prefetch") if cfg.prefetch else None
        self._reads = InFlightReads()   # close() abandons them: a stopping run does not wait for a stalled server

    # --- the stream --------------------------------------------------------------------------------------

    def _order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Shard indices of `epoch` in visiting order (skipped shards left out) and their cumulative counts."""
        if epoch not in self._order_cache:
            perm = np.random.default_rng([self.cfg.seed, epoch]).permutation(len(self.manifest.shards))
            order = np.array([i for i in perm if self.manifest.shards[i].name not in self._skipped], dtype=np.int64)
            if not len(order):
                raise ShardError(f"{self.manifest.location}: every shard was skipped as corrupt")
            counts = np.array([self.manifest.shards[i].num_samples for i in order], dtype=np.int64)
            self._order_cache = {epoch: (order, np.cumsum(counts))}
        return self._order_cache[epoch]

    def _order_lists(self, epoch: int) -> tuple[list[int], list[int]]:
        """`_order(epoch)` as Python lists (cheaper to index per batch than numpy scalars)."""
        order, ends = self._order(epoch)
        if self._order_lists_cache[0] is not order:
            self._order_lists_cache = (order, (order.tolist(), ends.tolist()))
        return self._order_lists_cache[1]

    def _read(self, shard: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """Read, validate and decode one shard (on the prefetch thread when prefetching). `epoch` is unused: the
        decoded shard is the same in every epoch."""
        info = self.manifest.shards[shard]
        seq_length = self.manifest.seq_length
        tokens, starts = read_shard_starts(self.manifest.shard_url(info.name), info, seq_length, self._pad_id,
                                           self.manifest.dtype, self._vocab_size, self._reads)
        if tokens.base is not None:   # a view of the file's mapping or buffer: own the data while it is cached
            tokens = tokens.copy()
        # A row holds at most S documents: int16 is exact up to S = 32768 (a quarter of int64's memory).
        dtype = np.int16 if seq_length <= 1 << 15 else np.int32
        return tokens, document_ids(starts, len(tokens), seq_length, dtype)

    def _submit(self, shard: int, epoch: int) -> Future | tuple:
        """The cache entry of `shard` (a future while it is read; its result once used), made most recent."""
        if shard not in self._cache:
            if self._pool is not None:
                self._cache[shard] = self._pool.submit(self._read, shard, epoch)
            else:
                future = Future()
                try:
                    future.set_result(self._read(shard, epoch))
                except Exception as err:  # delivered by .result(), like the pool does
                    future.set_exception(err)
                self._cache[shard] = future
        self._cache.move_to_end(shard)
        return self._cache[shard]

    def _rows(self, shard: int, epoch: int) -> np.ndarray:
        key = (epoch, shard)
        if key not in self._rows_cache:
            if len(self._rows_cache) >= 4:   # only the shards in use are asked for
                self._rows_cache.clear()
            n = self.manifest.shards[shard].num_samples
            self._rows_cache[key] = np.random.default_rng([self.cfg.seed, epoch, shard]).permutation(n)
        return self._rows_cache[key]

    def _shard(self, k: int, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The k-th shard of `epoch`'s order: (tokens, document ids, row order); prefetches the next one and keeps
        the cache within its bound."""
        order, _ = self._order_lists(epoch)
        current = order[k]
        nxt = order[k + 1] if k + 1 < len(order) else None
        if self._pool is not None and nxt is not None and nxt not in self._cache:
            self._submit(current, epoch)          # the current one first in the pool's queue
            self._submit(nxt, epoch)
        entry = self._submit(current, epoch)      # the most recently used
        if isinstance(entry, Future):
            entry = entry.result()                # raises the read's error (the failed future stays cached)
            self._cache[current] = entry
            self._cache_sizes[current] = entry[0].nbytes + entry[1].nbytes
            self._evict(keep=(current, nxt))
        return entry[0], entry[1], self._rows(current, epoch)

    def _evict(self, keep: tuple) -> None:
        """Drop least recently used shards until the used ones fit in cfg.cache_bytes (never those in `keep`)."""
        total = sum(self._cache_sizes.values())
        for shard in list(self._cache):
            if total <= self.cfg.cache_bytes:
                break
            if shard not in keep and shard in self._cache_sizes:
                total -= self._cache_sizes.pop(shard)
                del self._cache[shard]

    def _walk(self, n: int, out: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Advance the stream by n samples; with `out` (tokens, document ids, both [n, S] int64), write them there."""
        filled = 0
        while n > 0:
            order, ends = self._order_lists(self.epoch)
            pos = self.consumed_samples - self._epoch_start
            if pos >= ends[-1]:
                log.info("data: epoch %d done (%d samples per epoch, %d consumed in all); starting epoch %d",
                         self.epoch, ends[-1], self.consumed_samples, self.epoch + 1)
                self.epoch += 1
                self._epoch_start = self.consumed_samples
                continue
            k = bisect.bisect_right(ends, pos)
            row = pos - (ends[k - 1] if k else 0)
            take = min(n, ends[k] - pos)
            if out is not None or self.cfg.skip_corrupt:  # with skipping, every rank must see the same corrupt shards
                try:
                    tokens, docs, rows = self._shard(k, self.epoch)
                except ShardError as err:
                    if not self.cfg.skip_corrupt:
                        raise
                    self._skip_shard(order[k], err)
                    continue
                if out is not None:
                    idx = rows[row:row + take]
                    out[0][filled:filled + take] = tokens[idx]   # one gather, converted to int64 on the way
                    out[1][filled:filled + take] = docs[idx]
                    filled += take
            self.consumed_samples += take
            n -= take

    def take(self, n: int, out: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Advance this loader's own stream by n samples, writing them into `out` (tokens, document ids: [n, S]
        int64) when given. For readers that interleave several streams (`mlmclm.data.blend`)."""
        self._walk(n, out)

    def peek(self, skip: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows [skip, skip + n) ahead of the current position (tokens, document ids: [n, S] int64), read without
        consuming them (`mlmclm.data.random_length` cuts samples that end inside a row another rank reads too)."""
        saved = self.consumed_samples, self.epoch, self._epoch_start
        out = (np.empty((n, self.manifest.seq_length), np.int64), np.empty((n, self.manifest.seq_length), np.int64))
        try:
            self._walk(skip)
            self._walk(n, out)
        finally:
            self.consumed_samples, self.epoch, self._epoch_start = saved
        return out

    def _skip_shard(self, shard: int, err: Exception) -> None:
        name = self.manifest.shards[shard].name
        self._skipped.add(name)
        self._order_cache.clear()
        log.warning("data: skipping corrupt shard %s (%d skipped so far): %s", name, len(self._skipped), err)

    # --- the API -------------------------------------------------------------------------------------------

    @property
    def skipped_shards(self) -> list[str]:
        return sorted(self._skipped)

    def next_global_batch(self) -> list[dict]:
        """This DP rank's micro-batches of the next global batch."""
        per_rank = self.cfg.global_batch_size // self.dp_size
        self._walk(self.dp_rank * per_rank)
        shape = (per_rank, self.manifest.seq_length)
        tokens, document_ids = np.empty(shape, np.int64), np.empty(shape, np.int64)
        sample_ids = np.arange(self.consumed_samples, self.consumed_samples + per_rank, dtype=np.int64)
        self._walk(per_rank, (tokens, document_ids))
        self._walk((self.dp_size - self.dp_rank - 1) * per_rank)
        tokens, document_ids, sample_ids = map(torch.from_numpy, (tokens, document_ids, sample_ids))
        mb = self.cfg.micro_batch_size
        if mb == per_rank:
            return [{"tokens": tokens, "sample_ids": sample_ids, "document_ids": document_ids}]
        return [
            {"tokens": tokens[i:i + mb], "sample_ids": sample_ids[i:i + mb], "document_ids": document_ids[i:i + mb]}
            for i in range(0, per_rank, mb)
        ]

    def state_dict(self) -> dict:
        return {
            "format": STATE_FORMAT,
            "seed": self.cfg.seed,
            "epoch": self.epoch,
            "consumed_samples": self.consumed_samples,
            "epoch_start": self._epoch_start,
            "skipped_shards": "\n".join(sorted(self._skipped)),
            "num_samples": self.manifest.num_samples,
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly after the last consumed sample. A state holding only `consumed_samples` (e.g. from
        megatron's counter) is placed by the manifest's counts, assuming no skipped shards."""
        if state.get("seed", self.cfg.seed) != self.cfg.seed:
            raise ValueError(f"loader state has seed {state['seed']}, config has {self.cfg.seed}: "
                             "the sample order would differ")
        if state.get("num_samples", self.manifest.num_samples) != self.manifest.num_samples:
            raise ValueError(f"loader state is for a dataset of {state['num_samples']} samples, "
                             f"{self.manifest.location} has {self.manifest.num_samples}")
        consumed = int(state["consumed_samples"])
        skipped = set(filter(None, state.get("skipped_shards", "").split("\n")))
        if "epoch" in state:
            epoch, epoch_start = int(state["epoch"]), int(state["epoch_start"])
        else:
            epoch = consumed // self.manifest.num_samples
            epoch_start = epoch * self.manifest.num_samples
        self.consumed_samples, self.epoch, self._epoch_start, self._skipped = consumed, epoch, epoch_start, skipped
        self._order_cache.clear()
        for shard in [s for s, f in self._cache.items()
                      if isinstance(f, Future) and f.done() and f.exception() is not None]:
            del self._cache[shard]   # read failures are retried; validated shards stay cached

    def close(self) -> None:
        """Stops reading: a read in flight (on the prefetch thread, or a batch being built ahead on another) is
        abandoned, not waited for — its thread then ends, and so can the process."""
        self._reads.abandon()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        self._cache.clear()
        self._cache_sizes.clear()
