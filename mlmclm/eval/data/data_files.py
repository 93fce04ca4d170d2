"""Opening an evaluation's data files (task JSONL and parquet, a data root's shards and qrels) as files from others.

A path in a task folder or a data root may be a FIFO (a plain open blocks until a writer appears: `evaluate.py
curve` waited forever), a device such as /dev/zero (endless) or a socket. Every data file is opened through
`bounded_read.open_regular_file`: anything but a regular file is refused naming the path and what it is, and a file
larger than DATA_FILE_LIMIT is refused before it is read (a task's rows are all held in memory as Python objects,
several times their size on disk: more than this would not fit anyway).
"""
from __future__ import annotations

import io
from pathlib import Path

from mlmclm.bounded_read import open_regular_file

DATA_FILE_LIMIT = 16 << 30
# The text one row of evaluation data may hold (all its strings together), as prepare_data bounds a document
# (--max-document-chars): a 24M-character row took the evaluation's peak memory from 1.4 to 4.3 GB when tokenized.
# 2 Mi characters is twice the longest Wikipedia article; a task may set its own (TaskSpec.max_row_chars).
MAX_ROW_CHARS = 1 << 21
# A JSON line holds its row's text escaped: at most 6 characters per character (\uXXXX), plus its keys.
JSON_ESCAPE_FACTOR = 6


def text_chars(value) -> int:
    """The characters of every string in a row (keys included), nested lists and objects walked."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(text_chars(k) + text_chars(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(text_chars(v) for v in value)
    return 0


def open_data_file(path: str | Path, what: str = "data file"):
    """`path` opened for binary reading, refused unless a regular file of at most DATA_FILE_LIMIT bytes."""
    return open_regular_file(path, DATA_FILE_LIMIT, what)


def open_data_text(path: str | Path, what: str = "data file", newline: str | None = None):
    """`path` opened for UTF-8 text reading (see open_data_file)."""
    return io.TextIOWrapper(open_data_file(path, what), encoding="utf-8", newline=newline)


def read_parquet_table(path: str | Path, what: str = "parquet file"):
    """The whole pyarrow Table of a parquet file, read through a vetted descriptor (never a FIFO or a device)."""
    import pyarrow.parquet as pq

    with open_data_file(path, what) as handle:
        return pq.read_table(handle)
