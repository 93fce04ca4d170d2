"""Deterministic, resumable loader of packed shards into megatron micro-batches.

The global sample stream depends only on (seed, data): epoch e visits the shards in an order shuffled by
(seed, e) and the rows of each shard in an order shuffled by (seed, e, shard). Global batch k is stream positions
[k*G, (k+1)*G); DP rank r takes the contiguous slice [r*G/dp, (r+1)*G/dp) of it and cuts it into micro-batches.
So the samples and their order are the same for any DP size, TP/PP layout or micro-batch size with the same
global batch size G. `sample_ids` are stream positions (unique across epochs): MLM masking keys on them.

Each rank reads the shards its slices fall in (a shard is read whole, then kept while it is in use; the next one
is prefetched on a thread). Resuming jumps straight to the saved position using the manifest's counts.
"""
from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from mlmclm.data.manifest import Manifest
from mlmclm.data.shards import ShardError, read_shard
from mlmclm.data.tokenizer import check_same_tokenizer

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

    def __post_init__(self):
        if self.global_batch_size < 1 or self.micro_batch_size < 1:
            raise ValueError("global_batch_size and micro_batch_size must be positive")
        if self.seed < 0:
            raise ValueError(f"seed must be non-negative, got {self.seed}")


class PackedLoader:
    def __init__(self, cfg: LoaderConfig, dp_rank: int = 0, dp_size: int = 1, expected_tokenizer: dict | None = None):
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank {dp_rank} outside [0, {dp_size})")
        if cfg.global_batch_size % (cfg.micro_batch_size * dp_size):
            raise ValueError(f"global_batch_size {cfg.global_batch_size} is not a multiple of micro_batch_size "
                             f"{cfg.micro_batch_size} x dp_size {dp_size}")
        self.cfg, self.dp_rank, self.dp_size = cfg, dp_rank, dp_size
        self.manifest = Manifest.load(cfg.path)
        m = self.manifest
        if expected_tokenizer is not None:
            check_same_tokenizer(m.tokenizer, expected_tokenizer, where=m.location)
        if sum(s.num_samples for s in m.shards) != m.num_samples or m.num_samples == 0:
            raise ValueError(f"{m.location}: shard sample counts do not add up to num_samples={m.num_samples}")
        self._pad_id = m.tokenizer.get("pad_id")
        self.epoch = 0
        self.consumed_samples = 0
        self._epoch_start = 0             # stream position where the current epoch began
        self._skipped: set[str] = set()   # corrupt shards skipped (skip_corrupt=True)
        self._order_cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._loaded: dict[int, Future] = {}  # shard index -> future (tokens, document_ids, row order)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="shard-prefetch") if cfg.prefetch else None

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

    def _read(self, shard: int, epoch: int):
        info = self.manifest.shards[shard]
        tokens, document_ids = read_shard(self.manifest.shard_url(info.name), info, self.manifest.seq_length,
                                          self._pad_id)
        rows = np.random.default_rng([self.cfg.seed, epoch, shard]).permutation(info.num_samples)
        # Converted once per shard here (on the prefetch thread), so a batch costs one gather per tensor.
        # (numpy, not torch, for the gathers: torch's CPU allocator pays page faults on every fresh batch.)
        return tokens.astype(np.int64), document_ids, rows

    def _submit(self, shard: int, epoch: int) -> Future:
        key = (epoch, shard)
        if key not in self._loaded:
            if self._pool is not None:
                self._loaded[key] = self._pool.submit(self._read, shard, epoch)
            else:
                future = Future()
                try:
                    future.set_result(self._read(shard, epoch))
                except Exception as err:  # delivered by .result(), like the pool does
                    future.set_exception(err)
                self._loaded[key] = future
        return self._loaded[key]

    def _shard(self, k: int, epoch: int):
        """The k-th shard of `epoch`'s order, loaded; drops older shards and prefetches the next one."""
        order, _ = self._order(epoch)
        current = (epoch, int(order[k]))
        nxt = (epoch, int(order[k + 1])) if k + 1 < len(order) else None
        future = self._submit(current[1], epoch)
        self._loaded = {key: f for key, f in self._loaded.items() if key in (current, nxt)}
        if nxt is not None and self._pool is not None:
            self._submit(nxt[1], epoch)
        return future.result()

    def _walk(self, n: int, collect: bool) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Advance the stream by n samples; with `collect`, return them as (tokens, document_ids, sample_ids)."""
        pieces = []
        while n > 0:
            order, ends = self._order(self.epoch)
            pos = self.consumed_samples - self._epoch_start
            if pos >= ends[-1]:
                log.info("data: epoch %d done (%d samples per epoch, %d consumed in all); starting epoch %d",
                         self.epoch, ends[-1], self.consumed_samples, self.epoch + 1)
                self.epoch += 1
                self._epoch_start = self.consumed_samples
                continue
            k = int(np.searchsorted(ends, pos, side="right"))
            row = pos - (ends[k - 1] if k else 0)
            take = int(min(n, ends[k] - pos))
            if collect or self.cfg.skip_corrupt:  # with skipping, every rank must see the same corrupt shards
                try:
                    tokens, document_ids, rows = self._shard(k, self.epoch)
                except ShardError as err:
                    if not self.cfg.skip_corrupt:
                        raise
                    self._skip_shard(int(order[k]), err)
                    continue
                if collect:
                    idx = rows[row:row + take]
                    ids = np.arange(self.consumed_samples, self.consumed_samples + take, dtype=np.int64)
                    pieces.append((tokens[idx], document_ids[idx], ids))
            self.consumed_samples += take
            n -= take
        return pieces

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
        self._walk(self.dp_rank * per_rank, collect=False)
        pieces = self._walk(per_rank, collect=True)
        self._walk((self.dp_size - self.dp_rank - 1) * per_rank, collect=False)
        tokens, document_ids, sample_ids = (torch.from_numpy(p[0] if len(p) == 1 else np.concatenate(p))
                                            for p in zip(*pieces))
        mb = self.cfg.micro_batch_size
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
        self._loaded.clear()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
