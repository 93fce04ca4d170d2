"""A local tokenizer directory's identity without importing `transformers`, once it has been computed.

Every training rank checks its data's tokenizer against the one its config names (mlmclm/train/data_fit.py). The
identity itself is cheap; importing `transformers` to load the tokenizer is not (~1 CPU-s per rank, all of the
check's cost, measured on the 2-core development machine): on a node of eight ranks that is eight imports for one
answer. So the identity of a local directory is kept under `$MLMCLM_CACHE/tokenizer-identity/`, in a file named by
a key over everything the answer depends on: the bytes of each regular file in the directory (a file over
`HASHED_FILE_LIMIT`, such as a model's weights beside its tokenizer, by its size and modification time), and the
versions of `transformers` and `tokenizers` that computed it. A changed file is a new key, never a stale answer.

The cache is an optimisation only: a directory it cannot key (a FIFO or device among its files, too many files),
an entry that is not a well-formed identity, or a cache folder that cannot be written all fall back to loading the
tokenizer, as before. Hub names are not local directories and always load.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
from importlib import metadata
from pathlib import Path

from mlmclm.atomic_write import write_atomic
from mlmclm.bounded_read import FileRefusedError, open_regular_file, read_regular_json
from mlmclm.data.tokenizer import (cache_root, check_token_ids, embedded_tokenizer_dir, identity_name, load_tokenizer,
                                   tokenizer_identity)

HASHED_FILE_LIMIT = 64 * 1024 * 1024  # tokenizer files are far smaller; weights beside them are keyed by stat
MAX_FILES = 256
_ENTRY_LIMIT = 64 * 1024  # an identity is a few hundred bytes
_FORMAT = 1  # bump when tokenizer_identity's fields or meaning change
_FIELDS = ("vocab_hash", "vocab_size", "bos_id", "eos_id", "mask_id", "pad_id")  # the identity's, less its name


def directory_key(directory: Path) -> str | None:
    """A hash of what the tokenizer loaded from `directory` depends on, or None when the directory holds something
    that is not a regular file or a folder, or more than `MAX_FILES` entries (then nothing is cached)."""
    digest = hashlib.sha256()
    versions = [_FORMAT] + [_version(name) for name in ("transformers", "tokenizers")]
    digest.update(json.dumps(versions).encode())
    entries = sorted(os.scandir(directory), key=lambda entry: entry.name)
    if len(entries) > MAX_FILES:
        return None
    for entry in entries:
        info = os.stat(entry.path)  # links followed, as the tokenizer's loader follows them
        if stat.S_ISDIR(info.st_mode):
            continue
        if not stat.S_ISREG(info.st_mode):
            return None
        digest.update(json.dumps([entry.name, info.st_size]).encode())
        if info.st_size > HASHED_FILE_LIMIT:
            digest.update(str(info.st_mtime_ns).encode())
            continue
        try:
            with open_regular_file(entry.path, HASHED_FILE_LIMIT) as stream:
                for block in iter(lambda: stream.read(1 << 20), b""):
                    digest.update(block)
        except FileRefusedError:  # swapped for something else since the stat
            return None
    return digest.hexdigest()


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def entry_path(key: str) -> Path:
    return cache_root() / "tokenizer-identity" / f"{key}.json"


def read_entry(path: Path) -> dict | None:
    """The cached identity (without its name) at `path`, or None when it is missing or not a well-formed one (its
    ids checked as a manifest's are: `check_token_ids`)."""
    try:
        entry = read_regular_json(path, _ENTRY_LIMIT)
        if not isinstance(entry, dict) or set(entry) != set(_FIELDS) or not isinstance(entry["vocab_hash"], str):
            return None
        check_token_ids(entry, where=str(path))
    except (OSError, ValueError):
        return None
    return entry


def cached_tokenizer_identity(name: str) -> dict:
    """The identity of the tokenizer `name` (a local directory, "embedded", or a hub name) as
    `tokenizer_identity(load_tokenizer(name))` gives it; a local directory's from the cache when its key is there
    (no `transformers` import), and written to the cache for the next process when it is not."""
    source = str(embedded_tokenizer_dir()) if name == "embedded" else name
    try:
        key = directory_key(Path(source)) if Path(source).is_dir() else None
    except OSError:  # an unreadable directory: the tokenizer's own loader reports it
        key = None
    try:
        path = entry_path(key) if key is not None else None
    except RuntimeError:  # no $MLMCLM_CACHE and no home directory (a container user without one): no cache
        path = None
    if path is None:
        return tokenizer_identity(load_tokenizer(source))
    cached = read_entry(path)
    if cached is not None:
        return {"name": identity_name(source), **{field: cached[field] for field in _FIELDS}}
    identity = tokenizer_identity(load_tokenizer(source))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps({field: identity[field] for field in _FIELDS}, sort_keys=True))
    except OSError:
        pass  # a read-only cache: the next process loads the tokenizer again
    return identity
