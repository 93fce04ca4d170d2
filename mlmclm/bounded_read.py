"""Reading a file someone else made without hanging or exhausting memory.

A path from others may name a FIFO (an `open` for reading blocks until a writer appears: on a cluster, until the
NCCL timeout), a device such as `/dev/zero` (endless), a socket, or a regular file far larger than what it should
hold. `read_regular_file` opens without blocking, refuses anything but a regular file naming the path and what it
is, and reads at most `limit` bytes: a larger file is refused, never read whole. `read_limited` bounds any stream
the same way (a URL response, a pipe's output). Every refusal is a `FileRefusedError`, a `ValueError`, so the
callers' usual clear-error paths report it.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

# Small metadata files (JSON and text: manifests, train state, run config, pointers) never come near this.
SMALL_FILE_LIMIT = 16 * 1024 * 1024
_CHUNK = 1 << 20


class FileRefusedError(ValueError):
    """A file from others that is not a regular file, or holds more than it may."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


def check_regular_file(path: str | Path, what: str = "file") -> os.stat_result:
    """The file's stat, after refusing anything that is not a regular file (links are followed, as `open` does)."""
    info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise FileRefusedError(f"{path}: refusing to read this {what}: it is {_kind(info.st_mode)}, not a regular file")
    return info


def open_regular_file(path: str | Path, limit: int, what: str = "file"):
    """`path` opened for binary reading, after refusing anything but a regular file of at most `limit` bytes.

    Opened with O_NONBLOCK so that a FIFO put in place of the file cannot block the open itself; the kind and size
    are then checked on the open descriptor (no window for a swap between a check and the open)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefusedError(f"{path}: refusing to read this {what}: it is {_kind(info.st_mode)}, not a "
                                   "regular file")
        if info.st_size > limit:
            raise FileRefusedError(f"{path}: refusing to read this {what}: it holds {info.st_size} bytes, more than "
                                   f"the {limit} it may")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def read_regular_file(path: str | Path, limit: int = SMALL_FILE_LIMIT, what: str = "file") -> bytes:
    """The bytes of the regular file `path`, refusing other kinds and files over `limit` bytes (see
    `open_regular_file`); a file that grows while read is stopped at the bound too."""
    with open_regular_file(path, limit, what) as stream:
        return read_limited(stream, limit, str(path), what)


def read_regular_text(path: str | Path, limit: int = SMALL_FILE_LIMIT, what: str = "file") -> str:
    return read_regular_file(path, limit, what).decode("utf-8")


def read_regular_json(path: str | Path, limit: int = SMALL_FILE_LIMIT, what: str = "file"):
    return json.loads(read_regular_file(path, limit, what))


def read_limited(stream, limit: int, source: str, what: str = "file") -> bytes:
    """At most `limit` bytes from `stream`; one byte more and the read stops with a refusal (a file that grows while
    read, an endless response)."""
    parts, size = [], 0
    while True:
        chunk = stream.read(min(_CHUNK, limit + 1 - size))
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        size += len(chunk)
        if size > limit:
            raise FileRefusedError(f"{source}: refusing to read this {what}: it holds more than the {limit} bytes it "
                                   "may")
