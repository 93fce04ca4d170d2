"""Write and read one shard: a webdataset tar of row blocks (see `manifest` for the layout)."""
from __future__ import annotations

import io
import mmap
import os
import tarfile
from pathlib import Path

import numpy as np

from mlmclm.atomic_write import atomic_file
from mlmclm.bounded_read import FileRefusedError, open_regular_file
from mlmclm.data.manifest import ShardInfo, is_url
from mlmclm.data.remote import InFlightReads, read_stream, shard_limit

TOKENS, DOC_STARTS = "tokens.npy", "doc_starts.npy"


class ShardError(ValueError):
    """A shard is missing, truncated, corrupt or does not match the manifest."""


TOKEN_DTYPES = {"uint16": np.uint16, "int32": np.int32}   # stored token dtypes (manifest `dtype`)


def token_dtype(vocab_size: int) -> str:
    """The stored dtype for a vocabulary: uint16 when every id fits (as Megatron does), int32 otherwise."""
    return "uint16" if vocab_size <= 1 << 16 else "int32"


def token_checksum(tokens: np.ndarray, previous: int = 0) -> int:
    """Sum of the token ids mod 2**64: catches corrupt or zeroed data at memory speed (crc32 is ~5x slower).
    The same value for the same ids stored as uint16 or int32 (ids are non-negative)."""
    unsigned = tokens.reshape(-1).view(np.uint16 if tokens.dtype.itemsize == 2 else np.uint32)
    return (previous + int(np.add.reduce(unsigned, dtype=np.uint64))) % (1 << 64)


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def write_shard(path: Path, blocks: list[tuple[np.ndarray, np.ndarray]], pad_id: int | None,
                dtype: str = "int32") -> ShardInfo:
    """Write `blocks` ([(tokens [n, S], doc_starts int64)]) to `path`, tokens stored as `dtype` (uint16/int32),
    via a temporary name and a rename, so a final name never holds a partial shard."""
    from webdataset import TarWriter

    checksum, rows, real = 0, 0, 0
    # a temporary file of a random name, created exclusively (never a link planted in a shared folder)
    with atomic_file(path, "wb") as stream, TarWriter(stream, encoder=False, mtime=0) as writer:
        for tokens, starts in blocks:
            tokens = _as_dtype(tokens, dtype)
            writer.write({"__key__": f"{rows:08d}", TOKENS: _npy(tokens), DOC_STARTS: _npy(starts)})
            checksum = token_checksum(np.ascontiguousarray(tokens), checksum)
            rows += len(tokens)
            real += int(tokens.size if pad_id is None else np.count_nonzero(tokens != pad_id))
    return ShardInfo(name=path.name, num_samples=rows, num_tokens=real, checksum=checksum)


def _as_dtype(tokens: np.ndarray, dtype: str) -> np.ndarray:
    if dtype not in TOKEN_DTYPES:
        raise ValueError(f"token dtype {dtype!r}: expected one of {sorted(TOKEN_DTYPES)}")
    target = TOKEN_DTYPES[dtype]
    if tokens.dtype == target:
        return tokens
    if tokens.size and (tokens.min() < 0 or tokens.max() > np.iinfo(target).max):
        raise ValueError(f"token ids in [{tokens.min()}, {tokens.max()}] do not fit {dtype}")
    return tokens.astype(target)


def read_shard(url: str, info: ShardInfo, seq_length: int, pad_id: int | None,
               dtype: str | None = None, vocab_size: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """All rows of a shard: tokens [n, S] (uint16 or int32, as stored; `dtype` checks it) and document ids [n, S] int64 (index of the document inside its
    row; 0 for the document the row starts in). Validated against the manifest (with `vocab_size`: every id in
    [0, vocab_size)); raises ShardError naming it."""
    tokens, starts = read_shard_starts(url, info, seq_length, pad_id, dtype, vocab_size)
    return tokens, document_ids(starts, *tokens.shape)


def read_shard_starts(url: str, info: ShardInfo, seq_length: int, pad_id: int | None,
                      dtype: str | None = None, vocab_size: int | None = None,
                      reads: InFlightReads | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Like `read_shard`, but returns the flat document starts (int64, as stored) instead of document ids, and
    tokens may be a view of the file's mapping or buffer. Validated against the manifest the same way. `reads`:
    the caller's reads in flight, which it may abandon (a URL's or command's; a local file is read at once)."""
    try:
        limit = shard_limit(info.num_samples, seq_length, np.dtype(TOKEN_DTYPES.get(dtype, np.int32)).itemsize)
        tokens, starts = _read_blocks(url, seq_length, limit, reads)
    except ShardError:
        raise
    except FileRefusedError as err:   # a FIFO, a device, more bytes than the manifest allows: its message names it
        raise ShardError(str(err)) from err
    except (OSError, EOFError, tarfile.TarError, ValueError, KeyError) as err:
        raise ShardError(f"shard {url}: unreadable or truncated ({type(err).__name__}: {err})") from err
    problems = []
    if dtype is not None and len(tokens) and tokens.dtype != TOKEN_DTYPES.get(dtype):
        problems.append(f"tokens are {tokens.dtype}, manifest says {dtype}")
    elif len(tokens) != info.num_samples:
        problems.append(f"{len(tokens)} samples, manifest says {info.num_samples}")
    elif token_checksum(tokens) != info.checksum:
        problems.append("token checksum differs from the manifest's (corrupt data)")
    else:
        real = tokens.size if pad_id is None else int(np.count_nonzero(tokens != pad_id))
        if real != info.num_tokens:
            problems.append(f"{real} tokens, manifest says {info.num_tokens}")
        elif vocab_size is not None:
            problems += token_range_problems(tokens, vocab_size)
    if problems:
        raise ShardError(f"shard {url}: " + "; ".join(problems))
    return tokens, starts


def token_range_problems(tokens: np.ndarray, vocab_size: int) -> list[str]:
    """[] when every id of `tokens` [n, S] lies in [0, vocab_size), else the first id outside it, with its place.

    A consistent manifest (counts, checksum) says nothing about the ids themselves: an id past the vocabulary
    passes every other check and fails only in the embedding (a device-side assert with TP 1, an id silently
    masked with TP > 1), on every rank, whenever the shard comes up. One max (and a min for signed ids) per
    shard read, at memory speed."""
    if not tokens.size:
        return []
    low = int(tokens.min()) if np.issubdtype(tokens.dtype, np.signedinteger) else 0
    high = int(tokens.max())
    if low >= 0 and high < vocab_size:
        return []
    row, col = (int(i) for i in np.argwhere((tokens < 0) | (tokens >= vocab_size))[0])
    return [f"token id {int(tokens[row, col])} (row {row}, column {col}) is outside the vocabulary [0, {vocab_size}) "
            f"of the manifest's tokenizer"]


def document_ids(starts: np.ndarray, rows: int, seq_length: int, dtype=np.int64) -> np.ndarray:
    """[rows, S] `dtype`: per row, 0 for the document the row starts in, +1 at each flat position in `starts`.
    (A row holds at most S documents, so int16 is exact for S <= 32768.)"""
    bounds = np.union1d(np.arange(0, rows * seq_length, seq_length), starts)   # sorted segment starts
    lengths = np.diff(np.append(bounds, rows * seq_length))
    first_of_row = np.searchsorted(bounds, bounds - bounds % seq_length)
    return np.repeat((np.arange(len(bounds)) - first_of_row).astype(dtype), lengths).reshape(rows, seq_length)


def _npy_view(data: bytes, offset: int, size: int, what: str) -> np.ndarray:
    """The array stored as .npy at data[offset:offset+size], as a view (no copy)."""
    head = io.BytesIO(bytes(data[offset:offset + min(size, 4096)]))
    version = np.lib.format.read_magic(head)
    read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    if version not in read_header:
        raise ShardError(f"{what}: unsupported .npy version {version}")
    shape, fortran, dtype = read_header[version](head)
    count = int(np.prod(shape))
    if fortran or dtype.hasobject or head.tell() + count * dtype.itemsize != size:
        raise ShardError(f"{what}: malformed array")
    return np.frombuffer(data, dtype=dtype, count=count, offset=offset + head.tell()).reshape(shape)


def _read_blocks(url: str, seq_length: int, limit: int, reads: InFlightReads | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Read the whole shard into memory once, then take its arrays as views of that buffer. At most `limit` bytes
    (what its manifest entry says it holds, plus headers): a larger shard, a FIFO or a device is refused."""
    if is_url(url):
        data = read_stream(url, limit, "shard", reads)
        index = io.BytesIO(data)  # shares `data`, no copy
    else:  # map local files: the arrays are then views of the page cache, not copies
        index = open_regular_file(url, limit, "shard")
        size = os.fstat(index.fileno()).st_size
        data = mmap.mmap(index.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    with index:
        return _blocks(url, data, index, seq_length)


def _blocks(url: str, data, index, seq_length: int) -> tuple[np.ndarray, np.ndarray]:
    token_blocks, start_blocks, parts, rows = [], [], {}, 0
    with tarfile.open(fileobj=index, mode="r:") as tar:
        for member in tar:
            if not member.isfile():
                continue
            if member.offset_data + member.size > len(data):
                raise ShardError(f"shard {url}: member {member.name} is truncated")
            key, _, ext = member.name.partition(".")
            parts.setdefault(key, {})[ext] = _npy_view(data, member.offset_data, member.size, f"shard {url}: "
                                                        f"{member.name}")
            if len(parts[key]) < 2:
                continue
            block = parts.pop(key)
            if set(block) != {TOKENS, DOC_STARTS}:
                raise ShardError(f"shard {url}: block {key} has members {sorted(block)}")
            tokens, starts = block[TOKENS], block[DOC_STARTS]
            if tokens.ndim != 2 or tokens.shape[1] != seq_length or tokens.dtype not in (np.uint16, np.int32):
                raise ShardError(f"shard {url}: block {key} has tokens {tokens.dtype}{list(tokens.shape)}, "
                                 f"expected uint16 or int32 [n, {seq_length}] (sequence length mismatch?)")
            if token_blocks and tokens.dtype != token_blocks[0].dtype:
                raise ShardError(f"shard {url}: block {key} has {tokens.dtype} tokens, earlier blocks "
                                 f"{token_blocks[0].dtype}")
            if starts.size and (starts.min() < 0 or starts.max() >= tokens.size):
                raise ShardError(f"shard {url}: block {key} has document starts outside the block")
            token_blocks.append(tokens)
            start_blocks.append(starts.astype(np.int64) + rows * seq_length)
            rows += len(tokens)
    if parts:
        raise ShardError(f"shard {url}: incomplete blocks {sorted(parts)}")
    if not token_blocks:
        return np.zeros((0, seq_length), np.int32), np.zeros(0, np.int64)
    tokens = token_blocks[0] if len(token_blocks) == 1 else np.concatenate(token_blocks)
    return tokens, np.concatenate(start_blocks)
