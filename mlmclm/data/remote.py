"""Reading a dataset's files from wherever its location says, with a bound on what is read.

A dataset location is a local path, an `http(s)://` URL or a `pipe:` command (webdataset's `gopen`, which runs
`curl` for URLs). What comes back is someone else's: a manifest that is `/dev/zero` or an endless response, a shard
far larger than its manifest says (600 MB read whole for a shard said to hold 8 rows of 16 tokens), a FIFO that
blocks the rank until the NCCL timeout. So a local file must be a regular file within the bound, and a stream is
read only up to the bound: one byte more and the reader stops, kills the command or `curl` (no waiting for an
endless producer to finish) and refuses, naming the location and the bound.

The bounds: `MANIFEST_LIMIT` for a manifest (a fixed cap: 64 MiB is ~500,000 shards' entries), and for a shard
`shard_limit` — what its manifest entry says it holds, plus a margin for the tar and .npy headers. In time: a
producer that sends nothing for `STALL_S` (a server that accepts and stalls, a command that never writes) is killed
and refused, well inside the collective timeout (30 min, mlmclm.parallel.runtime) the other ranks would wait out.

A reader that no longer wants its data (a run stopping for a preemption while a shard is read ahead) abandons its
reads in flight (`InFlightReads.abandon`): their producers are killed, so a stalled read ends now, not STALL_S later.
"""
from __future__ import annotations

import os
import select
import threading

from mlmclm.bounded_read import FileRefusedError, read_limited

MANIFEST_LIMIT = 64 * 1024 * 1024
# Per stored block (at most one per row): two tar headers, their padding and two .npy headers.
_BLOCK_OVERHEAD = 2 * (512 + 511 + 4096)
_SHARD_SLACK = 1 << 20   # the tar's end-of-archive records and anything else fixed
STALL_S = 180.0  # no byte for this long from a URL or command: stalled (curl's own connect timeout is 30 s)


def shard_limit(num_samples: int, seq_length: int, token_bytes: int = 4) -> int:
    """The most bytes a shard of `num_samples` rows of `seq_length` tokens can take as `write_shard` stores it:
    the tokens, at most one int64 document start per token, and the headers of at most one block per row."""
    rows = max(int(num_samples), 0)
    return rows * seq_length * (token_bytes + 8) + rows * _BLOCK_OVERHEAD + _SHARD_SLACK


class ReadAbandoned(OSError):
    """The read's owner abandoned it (`InFlightReads.abandon`) before it ended."""


class InFlightReads:
    """One owner's reads in flight (a loader's: its prefetch thread reads while the training loop runs), so that
    the owner can abandon them all from another thread: each read's producer is killed, and the read ends at once
    with ReadAbandoned. A read started after `abandon` is abandoned as it starts."""

    def __init__(self):
        self._lock = threading.Lock()
        self._streams: set = set()
        self.abandoned = False

    def add(self, stream) -> None:
        with self._lock:
            self._streams.add(stream)
            if not self.abandoned:
                return
        _kill(stream)

    def discard(self, stream) -> None:
        with self._lock:
            self._streams.discard(stream)

    def abandon(self) -> None:
        with self._lock:
            self.abandoned = True
            streams = list(self._streams)
        for stream in streams:
            _kill(stream)


def read_stream(location: str, limit: int, what: str, reads: InFlightReads | None = None) -> bytes:
    """At most `limit` bytes from a URL or `pipe:` command (FileRefusedError past it). The producer is killed when
    the bound is reached or the read fails; when it ends by itself its exit status is checked (an OSError).
    `reads`: the owner's reads in flight, which it may abandon (ReadAbandoned)."""
    from webdataset.gopen import gopen

    stream = gopen(location, "rb")
    if reads is not None:
        reads.add(stream)
    try:
        # a command's output (curl's for a URL) is read from its pipe as bytes arrive, each wait at most STALL_S
        source = _Watched(stream.stream, location, what) if getattr(stream, "proc", None) is not None else stream
        data = read_limited(source, limit, location, what)
        if reads is not None and reads.abandoned:
            raise ReadAbandoned(f"{location}: this {what}'s read was abandoned by its reader")
    except BaseException:
        _abandon(stream)
        raise
    finally:
        if reads is not None:
            reads.discard(stream)
    stream.close()   # waits for the command (it has ended: its output did) and raises on a failed exit status
    return data


class _Watched:
    """A producer's pipe, read straight from its descriptor (no buffer that could hold bytes `select` cannot see),
    refusing when nothing arrives for STALL_S."""

    def __init__(self, pipe, location: str, what: str):
        self.fd, self.location, self.what = pipe.fileno(), location, what

    def read(self, size: int) -> bytes:
        ready, _, _ = select.select([self.fd], [], [], STALL_S)
        if not ready:
            raise FileRefusedError(f"{self.location}: refusing to wait longer for this {self.what}: nothing arrived "
                                   f"for {STALL_S:.0f} s (the server or command has stalled)")
        return os.read(self.fd, size)


def _kill(stream) -> None:
    """Kill a read's producer from any thread; its reader then sees the end of the pipe."""
    process = getattr(stream, "proc", None)
    if process is not None and process.poll() is None:
        try:
            process.kill()
        except ProcessLookupError:   # it ended meanwhile
            pass


def _abandon(stream) -> None:
    """Stop reading `stream` at once: kill its producer (a `gopen` Pipe's process) rather than wait for it."""
    process = getattr(stream, "proc", None)
    if process is not None:
        process.kill()
        process.wait()
        stream.stream.close()   # the Pipe's own close now finds it closed and waits for nothing
    else:
        stream.close()
