"""Raw text -> tokenized, packed rows of `seq_length` tokens -> numbered webdataset shards + manifest.

Documents are wrapped in BOS ... EOS and concatenated; a row may end inside a document, which then continues at
the next row. Each shard records where documents start inside its rows, so the loader can give per-document
attention masks or position resets. Output is deterministic (independent of the number of workers): re-running
rewrites the same shards. A whole dataset is written into a staging folder beside the output and published at the
end (mlmclm.data.staging): a refused or interrupted run leaves nothing there. A partitioned job writes its part in
place (the merge checks every part); its shards are written under temporary names and renamed when complete, and
the manifest is written last, so it never leaves a partial shard under a final name nor a manifest that describes
shards it did not write.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import multiprocessing as mp
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from mlmclm.atomic_write import temp_pattern
from mlmclm.data.manifest import MANIFEST_NAME, Manifest, ShardInfo
from mlmclm.data.packing import Packer
from mlmclm.data.partition import PART_PATTERN, VALIDATION_DIR, write_tails
from mlmclm.data.shards import TOKEN_DTYPES, token_dtype, write_shard
from mlmclm.data.staging import SHARD_PATTERN, staged_dataset
from mlmclm.data.sources import (MAX_DOCUMENT_CHARS, PrepareError, chosen_split, expand_inputs, hf_documents,
                                 iter_documents)
from mlmclm.data.tokenizer import load_tokenizer, tokenizer_identity
from mlmclm.redact import redact, redact_tree

log = logging.getLogger(__name__)


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
    split: str | None = None  # None: "train" of a hub dataset, the only split of a saved DatasetDict
    streaming: bool = False
    # Partitioned preparation: this job prepares the document groups g with g % num_partitions == partition
    # (a group is `group_docs` consecutive documents). See mlmclm.data.partition.
    partition: int = 0
    num_partitions: int = 1
    group_docs: int = 100_000
    token_dtype: str | None = None  # None: uint16 when the vocabulary fits, else int32
    # Hold out every K-th document (index % K == K - 1) as a validation split, prepared like the rest into
    # OUTPUT/validation/ and recorded in the manifest (mlmclm.train.validation evaluates on it). None: no split.
    validation_every: int | None = None
    # A longer document is refused naming it (mlmclm.data.sources: reads of files from others are bounded).
    max_document_chars: int = MAX_DOCUMENT_CHARS

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
        if self.validation_every is not None and self.validation_every < 2:
            raise PrepareError(f"validation_every must be >= 2 (every K-th document held out), got "
                               f"{self.validation_every}")
        if self.max_document_chars < 1:
            raise PrepareError(f"max_document_chars must be positive, got {self.max_document_chars}")
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
        docs = hf_documents(cfg.dataset, cfg.dataset_config, cfg.split, cfg.streaming, cfg.text_field, wanted,
                            cfg.max_document_chars)
        config = f":{cfg.dataset_config}" if cfg.dataset_config else ""
        inputs = [f"hf:{cfg.dataset}{config}[{chosen_split(cfg.dataset, cfg.split)}]"]
    else:
        files = expand_inputs(cfg.inputs)
        docs = iter_documents(files, cfg.text_field, wanted, cfg.max_document_chars)
        inputs = [str(p) for p in files]
    return _prepare_with_validation(docs, cfg, inputs)


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
    return _prepare_with_validation(docs, cfg, cfg.inputs)



def _prepare_with_validation(docs: Iterable[tuple[int, str | None]], cfg: PrepareConfig,
                             inputs: list[str]) -> Manifest:
    """The dataset written into a staging folder, published at the end (a partition: in place)."""
    if cfg.partitioned:
        return _prepare_dataset(docs, cfg, inputs)
    with staged_dataset(cfg.output_dir) as staging:
        # the manifest's command names the output asked for, not the staging folder
        staged = dataclasses.replace(cfg, output_dir=str(staging), command=cfg.command or repr(cfg))
        manifest = _prepare_dataset(docs, staged, inputs)
    manifest.location = str(Path(cfg.output_dir) / MANIFEST_NAME)
    log.info("published %s", cfg.output_dir)
    return manifest


def _prepare_dataset(docs: Iterable[tuple[int, str | None]], cfg: PrepareConfig, inputs: list[str]) -> Manifest:
    """The training rows and, with `validation_every` K, the held-out split: documents whose index is K-1 mod K
    are kept out of the training rows and prepared, by the same packing (partitions and groups included, so a
    merge gives the same rows), into OUTPUT/validation/; the training manifest records it. The held-out texts wait
    in memory while the training rows are written (1/K of the corpus)."""
    every = cfg.validation_every
    if every is None:
        return _prepare_documents(docs, cfg, inputs=inputs)
    held: list[tuple[int, str]] = []

    def training_documents():
        for index, text in docs:
            if index % every == every - 1:
                if text is not None:
                    held.append((index, text))
                text = None
            yield index, text

    def add_split(manifest: Manifest, out: Path) -> None:
        if not held and not cfg.partitioned:
            raise PrepareError(f"validation_every {every}: no document held out (the corpus has "
                               f"{manifest.num_documents} documents, fewer than {every}; a .txt file is one "
                               f"document, a .jsonl line one); lower it")
        split_dir = Path(cfg.output_dir) / VALIDATION_DIR
        split_cfg = dataclasses.replace(cfg, output_dir=str(split_dir), validation_every=None, max_tokens=None,
                                        command=f"{cfg.command or 'prepare'} (validation split: every {every}th "
                                                f"document)")
        split = _prepare_documents(iter(held), split_cfg, inputs=inputs)
        manifest.validation = {"path": os.path.relpath(split.location, out), "every": every,
                               "num_documents": split.num_documents, "num_samples": split.num_samples,
                               "num_tokens": split.num_tokens}

    return _prepare_documents(training_documents(), cfg, inputs=inputs, before_save=add_split)


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


def _growing_parts(batch: list[str]) -> Iterator[list[str]]:
    """`batch` in consecutive parts of 1, 2, 4, ... documents. A preparation capped by `max_tokens` stops asking for
    parts once it has enough: the tiny recipes' 40k tokens are one or two of the embedded corpus's 42 works, which
    one batch of 512 tokenized whole (3.7 CPU-s instead of 0.9 on the development machine). The batch itself is
    drawn as before (a validation split holds out the documents drawn), and the rows do not depend on the parts."""
    start, size = 0, 1
    while start < len(batch):
        yield batch[start:start + size]
        start, size = start + size, 2 * size


def _encoded(docs: Iterable[tuple[int, str | None]], cfg: PrepareConfig,
             tokenizer_json: str) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """(group, flat ids, lengths) per batch of documents, in input order; at most 2 batches per worker in flight."""
    batches = _batches(docs, cfg.docs_per_task, cfg.group_docs)
    if cfg.workers <= 1:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_str(tokenizer_json)
        for group, batch in batches:
            parts = _growing_parts(batch) if cfg.max_tokens is not None else [batch]
            yield from ((group, *_encode(part, tokenizer)) for part in parts)
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


# --- writing ------------------------------------------------------------------------------------------------------

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


def _prepare_documents(docs: Iterable[tuple[int, str | None]], cfg: PrepareConfig, inputs: list[str],
                       before_save: Callable[[Manifest, Path], None] | None = None) -> Manifest:
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
    for stale in [*out.glob("shard-*.tar.tmp"), *out.glob(temp_pattern("shard-*.tar"))]:   # older and current names
        stale.unlink()

    S, pad_id = cfg.seq_length, ident["pad_id"]
    packer = Packer(S, ident["bos_id"], ident["eos_id"])
    tails = Packer(S, ident["bos_id"], ident["eos_id"])   # single run: the groups' tails, packed in group order
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
        dtype=dtype, command=redact(cfg.command or repr(cfg)), inputs=redact_tree(inputs),
    )
    if cfg.partitioned:
        manifest.partition = {"index": cfg.partition, "count": cfg.num_partitions, "group_docs": cfg.group_docs}
        manifest.tails = write_tails(out, part_tails)
    if before_save is not None:   # e.g. the validation split, recorded before the manifest exists
        before_save(manifest, out)
    manifest.save(out)
    manifest.location = str(out / MANIFEST_NAME)
    log.info("prepared %d samples (%d tokens, %d documents, %s) in %d shards under %s", manifest.num_samples,
             manifest.num_tokens, num_docs, dtype, len(shards), out)
    return manifest
