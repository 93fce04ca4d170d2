"""The packing of documents into fixed-length rows, shared by a preparation run and the merge of its parts.

Documents are wrapped in BOS ... EOS and concatenated into one token stream, which is cut into rows of S tokens;
the flat positions where documents start are kept, so the loader can mark document boundaries.
"""
from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger(__name__)


class Packer:
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
