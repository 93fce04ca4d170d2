"""Raw text inputs for prepare: .txt (one file = one document), .jsonl (one document per line, a text field),
.parquet (a text column), each optionally gzip-compressed; a directory or a glob expands to those files."""
from __future__ import annotations

import glob
import gzip
import io
import json
from pathlib import Path
from typing import Iterator

SUFFIXES = (".txt", ".jsonl", ".parquet")


class PrepareError(ValueError):
    """Bad input or settings for prepare; the message names the file/field at fault."""


def _kind(path: Path) -> str | None:
    name = path.name.lower()
    name = name[:-3] if name.endswith(".gz") else name
    return next((s for s in SUFFIXES if name.endswith(s)), None)


def expand_inputs(inputs: list[str]) -> list[Path]:
    """Files named by `inputs` (files, directories, globs), in the given order, each expansion sorted."""
    files: list[Path] = []
    for spec in inputs:
        matches = [Path(spec)] if Path(spec).exists() else [Path(p) for p in sorted(glob.glob(spec, recursive=True))]
        if not matches:
            raise PrepareError(f"input {spec!r}: no such file, directory or glob match")
        for match in matches:
            if match.is_dir():
                found = sorted(p for p in match.rglob("*") if p.is_file() and _kind(p))
                if not found:
                    raise PrepareError(f"input directory {match}: no {'/'.join(SUFFIXES)} files (or .gz of them)")
                files.extend(found)
            elif _kind(match):
                files.append(match)
            elif match.is_file() and spec == str(match):
                raise PrepareError(f"input {match}: unsupported file type (want {', '.join(SUFFIXES)}, maybe .gz)")
    return files


def _open_text(path: Path):
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def read_documents(path: Path, text_field: str = "text") -> Iterator[str]:
    """The documents of one input file. Errors name the file (and line or column)."""
    kind = _kind(path)
    try:
        if kind == ".txt":
            with _open_text(path) as f:
                yield f.read()
        elif kind == ".jsonl":
            with _open_text(path) as f:
                for line_no, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise PrepareError(f"{path}:{line_no}: invalid JSON ({err})") from err
                    if not isinstance(record, dict) or text_field not in record:
                        fields = sorted(record) if isinstance(record, dict) else type(record).__name__
                        raise PrepareError(f"{path}:{line_no}: no field {text_field!r} (found {fields}); "
                                           f"choose it with --text-field")
                    if not isinstance(record[text_field], str):
                        raise PrepareError(f"{path}:{line_no}: field {text_field!r} is "
                                           f"{type(record[text_field]).__name__}, not text")
                    yield record[text_field]
        elif kind == ".parquet":
            yield from _parquet_documents(path, text_field)
        else:
            raise PrepareError(f"{path}: unsupported input type")
    except PrepareError:
        raise
    except (OSError, UnicodeDecodeError, EOFError) as err:
        raise PrepareError(f"cannot read {path}: {type(err).__name__}: {err}") from err


def _parquet_documents(path: Path, text_field: str) -> Iterator[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        source = io.BytesIO(gzip.decompress(path.read_bytes())) if path.name.lower().endswith(".gz") else path
        table = pq.ParquetFile(source)
    except (pa.ArrowException, OSError) as err:
        raise PrepareError(f"cannot read {path}: {err}") from err
    columns = table.schema_arrow.names
    if text_field not in columns:
        raise PrepareError(f"{path}: no column {text_field!r} (found {columns}); choose it with --text-field")
    if not pa.types.is_string(table.schema_arrow.field(text_field).type) and \
            not pa.types.is_large_string(table.schema_arrow.field(text_field).type):
        raise PrepareError(f"{path}: column {text_field!r} is {table.schema_arrow.field(text_field).type}, not text")
    for batch in table.iter_batches(columns=[text_field]):
        yield from (text for text in batch.column(0).to_pylist() if text is not None)
