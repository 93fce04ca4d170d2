"""Write and read one shard: a webdataset tar of row blocks (see `manifest` for the layout)."""
from __future__ import annotations

import io
import os
import tarfile
import zlib
from pathlib import Path

import numpy as np

from mlmclm.data.manifest import ShardInfo, is_url

TOKENS, DOC_STARTS = "tokens.npy", "doc_starts.npy"


class ShardError(ValueError):
    """A shard is missing, truncated, corrupt or does not match the manifest."""


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def write_shard(path: Path, blocks: list[tuple[np.ndarray, np.ndarray]], pad_id: int | None) -> ShardInfo:
    """Write `blocks` ([(tokens [n, S] int32, doc_starts int64)]) to `path` via a temporary name and a rename,
    so a final name never holds a partial shard."""
    from webdataset import TarWriter

    tmp = path.with_name(path.name + ".tmp")
    checksum, rows, real = 0, 0, 0
    try:
        with open(tmp, "wb") as stream, TarWriter(stream, encoder=False, mtime=0) as writer:
            for tokens, starts in blocks:
                writer.write({"__key__": f"{rows:08d}", TOKENS: _npy(tokens), DOC_STARTS: _npy(starts)})
                checksum = zlib.crc32(np.ascontiguousarray(tokens).data, checksum)
                rows += len(tokens)
                real += int(tokens.size if pad_id is None else np.count_nonzero(tokens != pad_id))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return ShardInfo(name=path.name, num_samples=rows, num_tokens=real, checksum=checksum)


def _open(url: str):
    if is_url(url):
        from webdataset.gopen import gopen

        return gopen(url, "rb")
    return open(url, "rb")


def read_shard(url: str, info: ShardInfo, seq_length: int, pad_id: int | None) -> tuple[np.ndarray, np.ndarray]:
    """All rows of a shard: tokens [n, S] int32 and document ids [n, S] int32 (index of the document inside its
    row; 0 for the document the row starts in). Validated against the manifest; raises ShardError naming it."""
    try:
        tokens, starts = _read_blocks(url, seq_length)
    except ShardError:
        raise
    except (OSError, EOFError, tarfile.TarError, ValueError, KeyError) as err:
        raise ShardError(f"shard {url}: unreadable or truncated ({type(err).__name__}: {err})") from err
    problems = []
    if len(tokens) != info.num_samples:
        problems.append(f"{len(tokens)} samples, manifest says {info.num_samples}")
    elif zlib.crc32(tokens.data) != info.checksum:
        problems.append("token checksum differs from the manifest's (corrupt data)")
    else:
        real = tokens.size if pad_id is None else int(np.count_nonzero(tokens != pad_id))
        if real != info.num_tokens:
            problems.append(f"{real} tokens, manifest says {info.num_tokens}")
    if problems:
        raise ShardError(f"shard {url}: " + "; ".join(problems))
    flags = np.zeros(tokens.size, dtype=np.int32)
    flags[starts] = 1
    return tokens, np.cumsum(flags.reshape(tokens.shape), axis=1, dtype=np.int32)


def _read_blocks(url: str, seq_length: int) -> tuple[np.ndarray, np.ndarray]:
    token_blocks, start_blocks, parts, rows = [], [], {}, 0
    with _open(url) as stream, tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, _, ext = member.name.partition(".")
            data = tar.extractfile(member).read()
            if len(data) != member.size:
                raise ShardError(f"shard {url}: member {member.name} is truncated")
            parts.setdefault(key, {})[ext] = data
            if len(parts[key]) < 2:
                continue
            block = parts.pop(key)
            if set(block) != {TOKENS, DOC_STARTS}:
                raise ShardError(f"shard {url}: block {key} has members {sorted(block)}")
            tokens = np.load(io.BytesIO(block[TOKENS]), allow_pickle=False)
            starts = np.load(io.BytesIO(block[DOC_STARTS]), allow_pickle=False)
            if tokens.ndim != 2 or tokens.shape[1] != seq_length or tokens.dtype != np.int32:
                raise ShardError(f"shard {url}: block {key} has tokens {tokens.dtype}{list(tokens.shape)}, "
                                 f"expected int32[n, {seq_length}] (sequence length mismatch?)")
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
