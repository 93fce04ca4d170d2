"""Raw text -> tokenized, packed rows of `seq_length` tokens -> numbered webdataset shards + manifest.

Documents are wrapped in BOS ... EOS and concatenated; a row may end inside a document, which then continues at
the next row. Each shard records where documents start inside its rows, so the loader can give per-document
attention masks or position resets. Output is deterministic (independent of the number of workers): re-running
rewrites the same shards. Shards are written under temporary names and renamed when complete, and the manifest is
written last, so an interrupted run never leaves a partial shard under a final name nor a manifest that
describes shards it did not write.
"""
from __future__ import annotations

import collections
import logging
import multiprocessing as mp
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from mlmclm.data.manifest import MANIFEST_NAME, Manifest, ShardInfo
from mlmclm.data.partition import PART_PATTERN, write_tails
from mlmclm.data.shards import TOKEN_DTYPES, token_dtype, write_shard
from mlmclm.data.sources import PrepareError, expand_inputs, hf_documents, iter_documents
from mlmclm.data.tokenizer import load_tokenizer, tokenizer_identity

log = logging.getLogger(__name__)
SHARD_PATTERN = re.compile(r"^shard-\d{6}\.tar$")


@dataclass
class PrepareConfig:
    inputs: list[str]
    output_dir: str
    tokenizer: str                 # HF hub name or local path; "embedded" for the demo tokenizer
    seq_length: int
    text_field: str = "text"
    samples_per_shard: int = 4096
    workers: int = max(1, min(8, (os.cpu_count() or 2) - 1))
    max_tokens: int | None = None  # cap on tokens written (BOS/EOS included)
    require_mask_token: bool = True
    rows_per_block: int = 256
    docs_per_task: int = 512
    progress: bool = True
    command: str = ""
    # A Hugging Face dataset instead of `inputs`: hub name, save_to_disk directory or load_dataset-able directory.
    dataset: str | None = None
    dataset_config: str | None = None
    split: str = "train"
    streaming: bool = False
    # Partitioned preparation: this job prepares the document groups g with g % num_partitions == partition
    # (a group is `group_docs` consecutive documents). See mlmclm.data.partition.
    partition: int = 0
    num_partitions: int = 1
    group_docs: int = 100_000
    token_dtype: str | None = None  # None: uint16 when the vocabulary fits, else int32

    def __post_init__(self):
        if not 2 <= self.seq_length <= 65536:
            raise PrepareError(f"seq_length must be in [2, 65536], got {self.seq_length}")
        if self.samples_per_shard < 1 or self.rows_per_block < 1 or self.docs_per_task < 1:
            raise PrepareError("samples_per_shard, rows_per_block and docs_per_task must be positive")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise PrepareError(f"max_tokens must be positive, got {self.max_tokens}")
        if bool(self.inputs) == (self.dataset is not None):
            raise PrepareError("give either inputs (files) or a dataset, not both" if self.inputs else
                               "no inputs given")
        if self.num_partitions < 1 or not 0 <= self.partition < self.num_partitions:
            raise PrepareError(f"partition {self.partition} is not in [0, num_partitions={self.num_partitions})")
        if self.group_docs < 1:
            raise PrepareError(f"group_docs must be positive, got {self.group_docs}")
        if self.token_dtype not in (None, *TOKEN_DTYPES):
            raise PrepareError(f"token_dtype {self.token_dtype!r}: expected one of {sorted(TOKEN_DTYPES)}")

    @property
    def partitioned(self) -> bool:
        return self.num_partitions > 1

    def wanted(self, index: int) -> bool:
        """Whether document number `index` belongs to this job."""
        return (index // self.group_docs) % self.num_partitions == self.partition


def prepare(cfg: PrepareConfig) -> Manifest:
    wanted = cfg.wanted if cfg.partitioned else None
    if cfg.dataset is not None:
        docs = hf_documents(cfg.dataset, cfg.dataset_config, cfg.split, cfg.streaming, cfg.text_field, wanted)
        inputs = [f"hf:{cfg.dataset}" + (f":{cfg.dataset_config}" if cfg.dataset_config else "") + f"[{cfg.split}]"]
    else:
        files = expand_inputs(cfg.inputs)
        docs = iter_documents(files, cfg.text_field, wanted)
        inputs = [str(p) for p in files]
    return _prepare_documents(docs, cfg, inputs=inputs)


def prepare_embedded_corpus(output_dir, seq_length: int, max_tokens: int | None = None, **overrides) -> Manifest:
    """The demo dataset: the embedded corpus (one document per work) with the embedded tokenizer."""
    from mlmclm.data.corpus import load_works
    from mlmclm.data.tokenizer import embedded_tokenizer_dir

    works = load_works()
    overrides.setdefault("command", f"prepare_embedded_corpus(seq_length={seq_length}, max_tokens={max_tokens})")
    cfg = PrepareConfig(
        inputs=["embedded:" + ",".join(w.key for w in works)], output_dir=str(output_dir),
        tokenizer=str(embedded_tokenizer_dir()), seq_length=seq_length, max_tokens=max_tokens, **overrides,
    )
    docs = ((i, w.text if not cfg.partitioned or cfg.wanted(i) else None) for i, w in enumerate(works))
    return _prepare_documents(docs, cfg, inputs=cfg.inputs)


# --- tokenization in worker processes -------------------------------------------------------------------------

_worker_tokenizer = None


def _init_worker(tokenizer_json: str) -> None:
    global _worker_tokenizer
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # parallelism comes from the processes
    from tokenizers import Tokenizer

    _worker_tokenizer = Tokenizer.from_str(tokenizer_json)


def _encode(texts: list[str], tokenizer=None) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of `texts` (no special tokens), concatenated, and the length of each."""
    encodings = (tokenizer or _worker_tokenizer).encode_batch(texts, add_special_tokens=False)
    lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
    flat = np.fromiter((i for e in encodings for i in e.ids), dtype=np.int32, count=int(lengths.sum()))
    return flat, lengths


def _batches(docs: Iterable[tuple[int, str | None]], size: int,
             group_docs: int) -> Iterator[tuple[int, list[str]]]:
    """(group, texts) batches of the non-empty wanted documents; a batch never spans two groups."""
    batch, group = [], None
    for index, text in docs:
        if text is None or not text.strip():
            continue
        if batch and (len(batch) == size or index // group_docs != group):
            yield group, batch
            batch = []
        group = index // group_docs
        batch.append(text)
    if batch:
        yield group, batch


def _encoded(docs: Iterable[tuple[int, str | None]], cfg: PrepareConfig,
             tokenizer_json: str) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(group, flat ids, lengths) per batch of documents, in input order; at most 2 batches per worker in flight."""
    batches = _batches(docs, cfg.docs_per_task, cfg.group_docs)
    if cfg.workers <= 1:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_str(tokenizer_json)
        yield from ((group, *_encode(batch, tokenizer)) for group, batch in batches)
        return
    with mp.get_context("spawn").Pool(cfg.workers, initializer=_init_worker, initargs=(tokenizer_json,)) as pool:
        pending = collections.deque()
        for group, batch in batches:
            pending.append((group, pool.apply_async(_encode, (batch,))))
            if len(pending) >= 2 * cfg.workers:
                group, result = pending.popleft()
                yield group, *result.get()
        while pending:
            group, result = pending.popleft()
            yield group, *result.get()


# --- packing and writing --------------------------------------------------------------------------------------

class _Packer:
    """Concatenates BOS + doc + EOS into a token stream and cuts it into rows, remembering document starts."""

    def __init__(self, seq_length: int, bos: int, eos: int):
        self.S, self.bos, self.eos = seq_length, bos, eos
        self.chunks: list[np.ndarray] = []
        self.starts: list[np.ndarray] = []   # stream offsets (relative to self.base) where documents begin
        self.buffered = 0                    # tokens in self.chunks

    def add(self, flat: np.ndarray, lengths: np.ndarray, limit: int | None) -> tuple[int, int]:
        """Append documents (truncated to `limit` tokens if given); returns (tokens, documents) added."""
        wrapped = lengths + 2
        offsets = np.concatenate([[0], np.cumsum(wrapped)[:-1]])
        out = np.empty(int(wrapped.sum()), dtype=np.int32)
        out[offsets] = self.bos
        out[offsets + wrapped - 1] = self.eos
        body = np.ones(len(out), dtype=bool)
        body[offsets] = body[offsets + wrapped - 1] = False
        out[body] = flat
        if limit is not None:
            out, offsets = out[:limit], offsets[offsets < limit]
        self.chunks.append(out)
        self.starts.append(offsets + self.buffered)
        self.buffered += len(out)
        return len(out), len(offsets)

    def add_tail(self, tokens: np.ndarray, starts: np.ndarray) -> None:
        """Append another group's tail; where it joins the stream a new segment starts, whether or not a document
        begins there (the tail may start inside a document whose beginning is elsewhere)."""
        self.chunks.append(tokens)
        self.starts.append(np.union1d([0], starts) + self.buffered)
        self.buffered += len(tokens)

    def take_tail(self) -> tuple[np.ndarray, np.ndarray]:
        """The buffered remainder (less than a row, after `rows`) and its document starts; empties the buffer."""
        stream = np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.int32)
        starts = np.concatenate(self.starts) if self.starts else np.zeros(0, np.int64)
        assert len(stream) < self.S, "take_tail before rows()"
        self.chunks, self.starts, self.buffered = [], [], 0
        return stream, starts.astype(np.int64)

    def rows(self, final: bool, pad_id: int | None) -> tuple[np.ndarray, np.ndarray]:
        """Complete rows from the buffer (and, if `final`, the padded remainder): tokens [n, S], flat doc starts."""
        stream = np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.int32)
        starts = np.concatenate(self.starts) if self.starts else np.zeros(0, np.int64)
        n = len(stream) // self.S
        if final and len(stream) % self.S and pad_id is not None:
            stream = np.concatenate([stream, np.full(self.S - len(stream) % self.S, pad_id, np.int32)])
            n += 1
        elif final and len(stream) % self.S:
            log.warning("tokenizer has no pad token: dropping the last %d tokens (a partial row)",
                        len(stream) % self.S)
        used = n * self.S
        self.chunks = [stream[used:]] if used < len(stream) else []
        self.starts = [starts[starts >= used] - used] if used < len(stream) else []
        self.buffered = len(stream) - used
        row_starts = starts[(starts < used) & (starts % self.S != 0)]
        return stream[:used].reshape(n, self.S), row_starts.astype(np.int64)


def _tokenizer_json(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise PrepareError(f"tokenizer {tokenizer.name_or_path!r} is not a fast (Rust) tokenizer")
    return backend.to_str()


def _checked_tokenizer(cfg: PrepareConfig):
    try:
        tokenizer = load_tokenizer(cfg.tokenizer)
    except Exception as err:  # transformers raises many types for a bad name or directory
        raise PrepareError(f"cannot load tokenizer {cfg.tokenizer!r}: {err}") from err
    ident = tokenizer_identity(tokenizer)
    for role in ("bos", "eos"):
        if ident[f"{role}_id"] is None:
            raise PrepareError(f"tokenizer {cfg.tokenizer!r} has no {role} token")
    if cfg.require_mask_token and ident["mask_id"] is None:
        raise PrepareError(f"tokenizer {cfg.tokenizer!r} has no mask token, which MLM needs "
                           "(add one, or pass --no-require-mask-token for CLM-only data)")
    return tokenizer, ident


def _prepare_documents(docs: Iterable[tuple[int, str | None]], cfg: PrepareConfig, inputs: list[str]) -> Manifest:
    """Pack the documents group by group: each group's rows start at a row boundary; the last partial row of each
    group (its *tail*) is packed with the other groups' tails, in group order, at the end of the stream. A
    partitioned job writes its groups' full rows and saves its tails for the merge, which packs them exactly as a
    single run does: the merged dataset holds the same rows."""
    tokenizer, ident = _checked_tokenizer(cfg)
    dtype = cfg.token_dtype or token_dtype(ident["vocab_size"])
    out = Path(cfg.output_dir)
    if cfg.partitioned:
        out = out / PART_PATTERN.format(cfg.partition, cfg.num_partitions)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST_NAME).unlink(missing_ok=True)  # the old manifest must not describe a half-rewritten set
    for stale in out.glob("shard-*.tar.tmp"):
        stale.unlink()

    S, pad_id = cfg.seq_length, ident["pad_id"]
    packer = _Packer(S, ident["bos_id"], ident["eos_id"])
    tails = _Packer(S, ident["bos_id"], ident["eos_id"])   # single run: the groups' tails, packed in group order
    part_tails: list[tuple[int, np.ndarray, np.ndarray]] = []   # partitioned: (group, tokens, starts) for merge
    shards: list[ShardInfo] = []
    pending: list[tuple[np.ndarray, np.ndarray]] = []  # row groups not yet written
    pending_rows = written = num_docs = 0
    group = None

    def queue_rows(tokens: np.ndarray, starts: np.ndarray) -> None:
        nonlocal pending_rows
        if len(tokens):
            pending.append((tokens, starts + pending_rows * S))  # flat offsets across `pending`
            pending_rows += len(tokens)

    def flush(final: bool) -> None:
        nonlocal pending, pending_rows
        while pending_rows >= cfg.samples_per_shard or (final and pending_rows):
            tokens = np.concatenate([t for t, _ in pending])
            starts = np.concatenate([s for _, s in pending])
            take = min(cfg.samples_per_shard, len(tokens))
            blocks = []
            for lo in range(0, take, cfg.rows_per_block):
                hi = min(lo + cfg.rows_per_block, take)
                sel = starts[(starts >= lo * S) & (starts < hi * S)]
                blocks.append((tokens[lo:hi], sel - lo * S))
            shards.append(write_shard(out / f"shard-{len(shards):06d}.tar", blocks, pad_id, dtype))
            rest = starts[starts >= take * S] - take * S
            pending = [(tokens[take:], rest)] if take < len(tokens) else []
            pending_rows = len(tokens) - take

    def end_group() -> None:
        tokens, starts = packer.take_tail()
        if not len(tokens):
            return
        if cfg.partitioned:
            part_tails.append((group, tokens, starts))
        else:
            tails.add_tail(tokens, starts)
            queue_rows(*tails.rows(final=False, pad_id=pad_id))

    from tqdm import tqdm

    bar = tqdm(total=cfg.max_tokens, unit="tok", unit_scale=True, disable=not cfg.progress, desc="prepare")
    try:
        for batch_group, flat, lengths in _encoded(docs, cfg, _tokenizer_json(tokenizer)):
            if batch_group != group:
                end_group()
                group = batch_group
            limit = None if cfg.max_tokens is None else cfg.max_tokens - written
            added, added_docs = packer.add(flat, lengths, limit)
            written += added
            num_docs += added_docs
            bar.update(added)
            queue_rows(*packer.rows(final=False, pad_id=pad_id))
            flush(final=False)
            if cfg.max_tokens is not None and written >= cfg.max_tokens:
                break
        if num_docs == 0 and not cfg.partitioned:
            raise PrepareError(f"empty corpus: no text in {', '.join(inputs) or 'the inputs'}")
        end_group()
        if not cfg.partitioned:
            queue_rows(*tails.rows(final=True, pad_id=pad_id))
        flush(final=True)
    finally:
        bar.close()
    if not shards and not cfg.partitioned:
        raise PrepareError(f"corpus too small: {written} tokens do not fill one row of {S}")
    if cfg.partitioned and num_docs == 0:
        log.warning("partition %d of %d holds no documents", cfg.partition, cfg.num_partitions)
    for old in out.iterdir():  # shards of an earlier, larger run in this directory
        if SHARD_PATTERN.match(old.name) and int(old.name[6:12]) >= len(shards):
            old.unlink()
    manifest = Manifest(
        seq_length=S, num_samples=sum(s.num_samples for s in shards),
        num_tokens=sum(s.num_tokens for s in shards), tokenizer=ident, shards=shards, num_documents=num_docs,
        dtype=dtype, command=cfg.command or repr(cfg), inputs=inputs,
    )
    if cfg.partitioned:
        manifest.partition = {"index": cfg.partition, "count": cfg.num_partitions, "group_docs": cfg.group_docs}
        manifest.tails = write_tails(out, part_tails)
    manifest.save(out)
    manifest.location = str(out / MANIFEST_NAME)
    log.info("prepared %d samples (%d tokens, %d documents, %s) in %d shards under %s", manifest.num_samples,
             manifest.num_tokens, num_docs, dtype, len(shards), out)
    return manifest
