"""Weighted blends of prepared datasets, and `build_loader`: the loader a `DataConfig` asks for.

The blended global stream interleaves the datasets' own streams (each a `PackedLoader` stream with its own seed):
position p goes to the dataset d maximising `w_d * (p + 1) - n_d`, where n_d counts the positions given to d so far
(ties to the first). The choice depends only on the weights and the counts, so the stream is deterministic, every
prefix is within one sample of the target proportions, and a resume needs only the counts. The global batch is cut
into DP slices exactly as for one dataset; a rank reads, from each dataset, only the samples its slice holds.
Sample ids are blended stream positions (unique: MLM masking keys on them).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from mlmclm.data.loader import LoaderConfig, PackedLoader, check_batch_split
from mlmclm.data.manifest import Manifest
from mlmclm.data.tokenizer import check_same_tokenizer

log = logging.getLogger(__name__)
STATE_FORMAT = 1


@dataclass
class BlendConfig:
    datasets: dict[str, float]   # path (directory, manifest, URL) -> weight (normalised)
    global_batch_size: int
    micro_batch_size: int
    seed: int = 1234
    skip_corrupt: bool = False
    prefetch: bool = True
    cache_bytes: int = 1 << 30   # per dataset
    log_every: int = 1000        # global batches between logs of the realised proportions

    def __post_init__(self):
        if not self.datasets:
            raise ValueError("a blend needs at least one dataset")
        for path, weight in self.datasets.items():
            if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not weight > 0:
                raise ValueError(f"blend weight of {path!r} must be a positive number, got {weight!r}")


def dataset_seed(seed: int, index: int) -> int:
    """Each dataset of a blend gets its own shuffling seed."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


class BlendedLoader:
    def __init__(self, cfg: BlendConfig, dp_rank: int = 0, dp_size: int = 1, expected_tokenizer: dict | None = None):
        check_batch_split(cfg.global_batch_size, cfg.micro_batch_size, dp_rank, dp_size)
        self.cfg, self.dp_rank, self.dp_size = cfg, dp_rank, dp_size
        self.names = list(cfg.datasets)
        total = float(sum(cfg.datasets.values()))
        self.weights = [cfg.datasets[n] / total for n in self.names]
        self.loaders = [
            PackedLoader(LoaderConfig(path, 1, 1, seed=dataset_seed(cfg.seed, i), skip_corrupt=cfg.skip_corrupt,
                                      prefetch=cfg.prefetch, cache_bytes=cfg.cache_bytes),
                         expected_tokenizer=expected_tokenizer)
            for i, path in enumerate(self.names)
        ]
        first = self.loaders[0].manifest
        for name, loader in zip(self.names[1:], self.loaders[1:]):
            m = loader.manifest
            check_same_tokenizer(m.tokenizer, first.tokenizer, where=f"blend dataset {name}")
            if m.seq_length != first.seq_length:
                raise ValueError(f"blend dataset {name}: seq_length {m.seq_length}, {self.names[0]} has "
                                 f"{first.seq_length}")
        # What the trainer checks (tokenizer, sequence length) is common to all; counts are the sums.
        self.manifest = Manifest(
            seq_length=first.seq_length, num_samples=sum(lo.manifest.num_samples for lo in self.loaders),
            num_tokens=sum(lo.manifest.num_tokens for lo in self.loaders), tokenizer=first.tokenizer, shards=[],
            num_documents=sum(lo.manifest.num_documents for lo in self.loaders), dtype=first.dtype,
            inputs=[lo.manifest.location for lo in self.loaders])
        self.manifest.location = "blend(" + ", ".join(f"{w:.4g}: {lo.manifest.location}"
                                                      for w, lo in zip(self.weights, self.loaders)) + ")"
        self.counts = [0] * len(self.loaders)   # blended positions given to each dataset so far
        self.consumed_samples = 0
        self._batches = 0
        if dp_rank == 0:
            log.info("data blend: %s", self.manifest.location)

    def _assign(self, n: int) -> np.ndarray:
        """The datasets of the next n stream positions (advances the counts)."""
        out = np.empty(n, np.int64)
        counts, weights = self.counts, self.weights
        position = sum(counts)
        for i in range(n):
            position += 1
            best, best_gap = 0, weights[0] * position - counts[0]
            for d in range(1, len(weights)):
                gap = weights[d] * position - counts[d]
                if gap > best_gap:
                    best, best_gap = d, gap
            counts[best] += 1
            out[i] = best
        return out

    def next_global_batch(self) -> list[dict]:
        """This DP rank's micro-batches of the next global batch."""
        per_rank = self.cfg.global_batch_size // self.dp_size
        lo, hi = self.dp_rank * per_rank, (self.dp_rank + 1) * per_rank
        assign = self._assign(self.cfg.global_batch_size)
        shape = (per_rank, self.manifest.seq_length)
        tokens, document_ids = np.empty(shape, np.int64), np.empty(shape, np.int64)
        for d, loader in enumerate(self.loaders):
            positions = np.flatnonzero(assign == d)
            mine = positions[(positions >= lo) & (positions < hi)] - lo
            before = int(np.count_nonzero(positions < lo))
            loader.take(before)
            if len(mine):
                part = (np.empty((len(mine), shape[1]), np.int64), np.empty((len(mine), shape[1]), np.int64))
                loader.take(len(mine), part)
                tokens[mine], document_ids[mine] = part
            loader.take(len(positions) - before - len(mine))
        sample_ids = np.arange(self.consumed_samples + lo, self.consumed_samples + hi, dtype=np.int64)
        self.consumed_samples += self.cfg.global_batch_size
        self._batches += 1
        if self.dp_rank == 0 and (self._batches == 1 or self._batches % self.cfg.log_every == 0):
            log.info("data blend after %d samples: %s", self.consumed_samples, self.describe_proportions())
        tokens, document_ids, sample_ids = map(torch.from_numpy, (tokens, document_ids, sample_ids))
        mb = self.cfg.micro_batch_size
        return [{"tokens": tokens[i:i + mb], "sample_ids": sample_ids[i:i + mb],
                 "document_ids": document_ids[i:i + mb]} for i in range(0, per_rank, mb)]

    def proportions(self) -> dict[str, float]:
        """Realised share of each dataset in the stream so far."""
        total = max(1, sum(self.counts))
        return {name: count / total for name, count in zip(self.names, self.counts)}

    def describe_proportions(self) -> str:
        return ", ".join(f"{name} {share:.2%} (target {w:.2%}, epoch {lo.epoch})" for (name, share), w, lo
                         in zip(self.proportions().items(), self.weights, self.loaders))

    @property
    def skipped_shards(self) -> list[str]:
        return [f"{name}:{s}" for name, lo in zip(self.names, self.loaders) for s in lo.skipped_shards]

    def state_dict(self) -> dict:
        return {"format": STATE_FORMAT, "kind": "blend", "seed": self.cfg.seed,
                "consumed_samples": self.consumed_samples, "weights": list(self.weights),
                "datasets": [lo.state_dict() for lo in self.loaders]}

    def load_state_dict(self, state: dict) -> None:
        """Continue exactly after the last consumed sample. A state holding only `consumed_samples` is placed by
        replaying the blend's choices (assuming no skipped shards)."""
        if state.get("seed", self.cfg.seed) != self.cfg.seed:
            raise ValueError(f"loader state has seed {state['seed']}, config has {self.cfg.seed}: "
                             "the sample order would differ")
        consumed = int(state["consumed_samples"])
        if "datasets" in state:
            if len(state["datasets"]) != len(self.loaders) or not np.allclose(state["weights"], self.weights,
                                                                              rtol=0, atol=1e-12):
                raise ValueError(f"loader state is for a blend with weights {state['weights']}, the config's are "
                                 f"{self.weights} ({', '.join(self.names)}): the sample order would differ")
            for name, loader, sub in zip(self.names, self.loaders, state["datasets"]):
                try:
                    loader.load_state_dict(sub)
                except ValueError as err:
                    raise ValueError(f"blend dataset {name}: {err}") from err
            self.counts = [lo.consumed_samples for lo in self.loaders]
            if sum(self.counts) != consumed:
                raise ValueError(f"loader state: dataset counts {self.counts} do not add up to {consumed}")
        else:
            if "kind" not in state and "epoch" in state:
                raise ValueError("loader state is of a single dataset, the config asks for a blend")
            self.counts = [0] * len(self.loaders)
            self._assign(consumed)
            for loader, count in zip(self.loaders, self.counts):
                loader.load_state_dict({"consumed_samples": count})
        self.consumed_samples = consumed

    def close(self) -> None:
        for loader in self.loaders:
            loader.close()


def build_loader(data, global_batch_size: int, micro_batch_size: int, dp_rank: int = 0, dp_size: int = 1,
                 expected_tokenizer: dict | None = None, pad_multiple: int = 1, same_length: bool = False):
    """The loader for a `DataConfig` (`data.path`: one dataset; `data.blend`: {path: weight}; with
    `data.random_length`, random-length samples of `data.path`, their micro-batches padded as
    `RandomLengthLoader` says). Every kind has `manifest` (tokenizer, seq_length), `next_global_batch`,
    `consumed_samples`, `state_dict`, `load_state_dict`, `close`."""
    blend = getattr(data, "blend", None)
    lengths = getattr(data, "random_length", None)
    if blend and lengths is not None:
        raise ValueError("data.random_length is not implemented for data.blend: give one dataset (data.path)")
    if blend:
        return BlendedLoader(BlendConfig(dict(blend), global_batch_size, micro_batch_size, seed=data.seed,
                                         skip_corrupt=data.skip_corrupt), dp_rank, dp_size, expected_tokenizer)
    cfg = LoaderConfig(data.path, global_batch_size, micro_batch_size, seed=data.seed, skip_corrupt=data.skip_corrupt)
    if lengths is not None:
        from mlmclm.data.random_length import RandomLengthLoader

        return RandomLengthLoader(cfg, lengths, dp_rank, dp_size, expected_tokenizer, pad_multiple, same_length)
    return PackedLoader(cfg, dp_rank, dp_size, expected_tokenizer)
