"""Random-length samples, as the paper trained: the packed token stream cut into samples of uniform random length.

The authors' Optimus trainer (`pack_dataset.py --random_size`) cuts the tokenized stream into samples whose length
is uniform in [12, 2048] and lays a micro-batch's samples end to end, attention confined to each sample: 2304
samples of 1030 tokens on average per step. Here the stream is the loader's row stream (`PackedLoader`: rows
shuffled by (seed, epoch), read as one sequence of tokens) and sample k is its next `length(seed, k)` tokens, so
no token is dropped and a sample may run across a row's end (a new document segment starts there, as at any row
start). Lengths are a counter-based hash of (seed, k): the same samples on any layout and after a resume, with
nothing to carry but the stream position.

A global batch is G samples; DP rank r takes samples [r·G/dp, (r+1)·G/dp), reading only the rows they lie in.
A micro-batch is `micro_batch_size` samples laid end to end as one row [1, T] and padded up to a multiple of
`pad_multiple` tokens (sequence parallelism and FP8 GEMMs need divisible lengths); with `same_length` (pipeline
parallelism: megatron's stages exchange fixed shapes) every micro-batch of the step is padded to the longest.
Each micro-batch carries per token its global sample index (`sample_ids`, -1 on padding), its position in the
sample (`positions`) and a document id (`document_ids`, increasing along the row); the objectives key masks and
labels on the first two, `mlmclm.model.document_attention` confines attention to each sample.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mlmclm.data.loader import LoaderConfig, PackedLoader, check_batch_split

STATE_KIND = "random_length"
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass
class SampleLengths:
    """Sample lengths uniform in [min_length, max_length] tokens (the paper: 12 and 2048)."""

    min_length: int = 12
    max_length: int = 2048

    def __post_init__(self):
        if not 2 <= self.min_length <= self.max_length:
            raise ValueError(f"data.random_length: need 2 <= min_length <= max_length, got min_length "
                             f"{self.min_length}, max_length {self.max_length}")

    @property
    def mean(self) -> float:
        return (self.min_length + self.max_length) / 2


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's output function on uint64 (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def sample_lengths(seed: int, start: int, count: int, lengths: SampleLengths) -> np.ndarray:
    """Lengths of samples [start, start + count) of the stream (int64): a pure function of (seed, index)."""
    with np.errstate(over="ignore"):
        key = _mix(np.array([seed], np.uint64) + _GOLDEN)
        counters = key + (np.arange(start, start + count, dtype=np.uint64) + np.uint64(1)) * _GOLDEN
        draws = _mix(counters) >> np.uint64(11)   # 53 uniform bits: the modulo bias is below 2**-42
    span = lengths.max_length - lengths.min_length + 1
    return (draws % np.uint64(span)).astype(np.int64) + lengths.min_length


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class RandomLengthLoader:
    """Random-length samples from one prepared dataset; the loader interface of `PackedLoader` plus
    `last_lengths`, the lengths of every sample of the last global batch (for tokens and FLOPs per step)."""

    def __init__(self, cfg: LoaderConfig, lengths: SampleLengths, dp_rank: int = 0, dp_size: int = 1,
                 expected_tokenizer: dict | None = None, pad_multiple: int = 1, same_length: bool = False):
        check_batch_split(cfg.global_batch_size, cfg.micro_batch_size, dp_rank, dp_size)
        if pad_multiple < 1:
            raise ValueError(f"pad_multiple must be >= 1, got {pad_multiple}")
        self.cfg, self.lengths, self.dp_rank, self.dp_size = cfg, lengths, dp_rank, dp_size
        self.pad_multiple, self.same_length = pad_multiple, same_length
        self.rows = PackedLoader(LoaderConfig(cfg.path, 1, 1, seed=cfg.seed, skip_corrupt=cfg.skip_corrupt,
                                              prefetch=cfg.prefetch, cache_bytes=cfg.cache_bytes),
                                 expected_tokenizer=expected_tokenizer)
        self.manifest = self.rows.manifest
        self.seq = self.manifest.seq_length
        pad = self.manifest.tokenizer.get("pad_id")
        self._pad_id = 0 if pad is None else pad   # never a label (sample id -1) nor attended by a sample
        self.consumed_samples = 0
        self.position = 0   # tokens of the row stream consumed (the rows loader stands at position // S)
        self.last_lengths: np.ndarray | None = None

    def _span(self, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens [start, end) of the row stream (absolute positions at or after the current one), with document
        ids that increase along the span (a row start is a document start)."""
        first, last = start // self.seq, -(-end // self.seq)
        tokens, docs = self.rows.peek(first - self.rows.consumed_samples, last - first)
        docs += np.concatenate([[0], np.cumsum(docs.max(axis=1) + 1)[:-1]])[:, None]
        lo = start - first * self.seq
        return tokens.reshape(-1)[lo:lo + end - start], docs.reshape(-1)[lo:lo + end - start]

    def next_global_batch(self) -> list[dict]:
        """This DP rank's micro-batches of the next global batch, each [1, T] (see the module's docstring)."""
        total, mb = self.cfg.global_batch_size, self.cfg.micro_batch_size
        per_rank = total // self.dp_size
        lengths = sample_lengths(self.cfg.seed, self.consumed_samples, total, self.lengths)
        ends = np.cumsum(lengths)
        starts = ends - lengths
        first = self.dp_rank * per_rank
        mine = lengths[first:first + per_rank]
        tokens, docs = self._span(self.position + int(starts[first]), self.position + int(ends[first + per_rank - 1]))
        sample_ids = np.repeat(np.arange(self.consumed_samples + first, self.consumed_samples + first + per_rank),
                               mine)
        positions = np.arange(len(tokens)) - np.repeat(starts[first:first + per_rank] - starts[first], mine)
        bounds = np.concatenate([[0], np.cumsum(mine)[mb - 1::mb]])
        width = max(int(b - a) for a, b in zip(bounds[:-1], bounds[1:])) if self.same_length else 0
        micro = []
        for j, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
            size = _round_up(max(int(b - a), width), self.pad_multiple)
            micro.append(self._micro_batch(tokens[a:b], sample_ids[a:b], positions[a:b], docs[a:b], size,
                                           mine[j * mb:(j + 1) * mb]))
        self.position += int(ends[-1])
        self.consumed_samples += total
        self.rows.take(self.position // self.seq - self.rows.consumed_samples)
        self.last_lengths = lengths
        return micro

    def _micro_batch(self, tokens, sample_ids, positions, docs, size: int, lengths) -> dict:
        pad = size - len(tokens)
        tail = docs[-1] + 1 if len(docs) else 0

        def row(values, fill):
            return torch.from_numpy(np.concatenate([values, np.full(pad, fill, np.int64)]).astype(np.int64)[None])

        return {"tokens": row(tokens, self._pad_id), "sample_ids": row(sample_ids, -1),
                "positions": torch.from_numpy(np.concatenate([positions, np.arange(pad)]).astype(np.int64)[None]),
                "document_ids": row(docs, tail), "lengths": torch.from_numpy(np.asarray(lengths, np.int64))}

    # --- the loader interface ---------------------------------------------------------------------------------

    @property
    def skipped_shards(self) -> list[str]:
        return self.rows.skipped_shards

    def state_dict(self) -> dict:
        return {"kind": STATE_KIND, "seed": self.cfg.seed, "consumed_samples": self.consumed_samples,
                "position": self.position, "min_length": self.lengths.min_length,
                "max_length": self.lengths.max_length, "rows": self.rows.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly after the last consumed sample."""
        if state.get("kind") != STATE_KIND:
            raise ValueError("loader state is of fixed-length rows, the config asks for random-length samples "
                             "(data.random_length): the samples would differ")
        saved = (state["min_length"], state["max_length"])
        if saved != (self.lengths.min_length, self.lengths.max_length):
            raise ValueError(f"loader state has sample lengths in {list(saved)}, data.random_length asks for "
                             f"[{self.lengths.min_length}, {self.lengths.max_length}]: the samples would differ")
        if state["seed"] != self.cfg.seed:
            raise ValueError(f"loader state has seed {state['seed']}, config has {self.cfg.seed}: "
                             "the sample order would differ")
        self.rows.load_state_dict(state["rows"])
        self.consumed_samples, self.position = int(state["consumed_samples"]), int(state["position"])
        if self.rows.consumed_samples != self.position // self.seq:
            raise ValueError(f"loader state: {self.rows.consumed_samples} rows consumed, but position "
                             f"{self.position} lies in row {self.position // self.seq}")

    def close(self) -> None:
        self.rows.close()
