"""Raw text inputs for prepare: .txt (one file = one document), .jsonl (one document per line, a text field),
.parquet (a text column), each optionally gzip-compressed; a directory or a glob expands to those files; or a
Hugging Face dataset (hub name, `save_to_disk` directory, or a local directory `load_dataset` reads).

Documents are numbered in input order (every record counts, also empty ones), so a partitioned preparation can
choose its documents by number: `wanted(index)` false yields None in their place without parsing them.

Reads are bounded: a document (a .txt file, a .jsonl line, a parquet or dataset value) longer than `max_chars` is
refused naming it, before more than that is held in memory where the format allows (.txt and .jsonl, gzipped or
not), and a gzipped parquet file decompresses to at most MAX_GZIP_PARQUET_BYTES: a file from others (a line without
an end, a gzip bomb) cannot exhaust the machine's memory."""
from __future__ import annotations

import glob
import gzip
import io
import json
from pathlib import Path
from typing import Callable, Iterator

from mlmclm.bounded_read import read_regular_json

SUFFIXES = (".txt", ".jsonl", ".parquet")
# A document longer than this is refused (--max-document-chars): about 1 GB of text, far beyond any real document
# (the longest Wikipedia articles hold about a million characters); a corpus in one .txt file should be split.
MAX_DOCUMENT_CHARS = 1 << 30
MAX_GZIP_PARQUET_BYTES = 4 << 30  # a .parquet.gz is decompressed in memory; larger: decompress it yourself


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


Wanted = Callable[[int], bool] | None


def too_long(where: str, max_chars: int) -> PrepareError:
    return PrepareError(f"{where}: a document longer than {max_chars:,} characters; refusing to hold it in memory "
                        f"(a .txt file is one document: split a corpus into files or a .jsonl, or raise "
                        f"--max-document-chars)")


def iter_documents(files: list[Path], text_field: str = "text", wanted: Wanted = None,
                   max_chars: int = MAX_DOCUMENT_CHARS) -> Iterator[tuple[int, str | None]]:
    """(document number, text) over all files; text is None for the documents `wanted` declines."""
    index = 0
    for path in files:
        for text in read_documents(path, text_field, index, wanted, max_chars):
            yield index, text
            index += 1


def read_documents(path: Path, text_field: str = "text", first_index: int = 0,
                   wanted: Wanted = None, max_chars: int = MAX_DOCUMENT_CHARS) -> Iterator[str | None]:
    """The documents of one input file (None for those `wanted(first_index + i)` declines: not parsed). Errors
    name the file (and line or column)."""
    kind = _kind(path)
    index = first_index
    try:
        if kind == ".txt":
            if wanted is not None and not wanted(index):
                yield None
                return
            with _open_text(path) as f:
                text = f.read(max_chars + 1)
            if len(text) > max_chars:
                raise too_long(str(path), max_chars)
            yield text
        elif kind == ".jsonl":
            with _open_text(path) as f:
                # readline's limit: a line without an end is never read whole (a line is the record plus "\n")
                for line_no, line in enumerate(iter(lambda: f.readline(max_chars + 2), ""), 1):
                    if len(line.rstrip("\n")) > max_chars:
                        raise too_long(f"{path}:{line_no}", max_chars)
                    if not line.strip():
                        continue
                    index += 1
                    if wanted is not None and not wanted(index - 1):
                        yield None
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
            for row, text in enumerate(_parquet_documents(path, text_field)):
                if len(text) > max_chars:
                    raise too_long(f"{path} row {row}", max_chars)
                yield text if wanted is None or wanted(index) else None
                index += 1
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
        source = io.BytesIO(_gunzip_bounded(path)) if path.name.lower().endswith(".gz") else path
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
        yield from (text or "" for text in batch.column(0).to_pylist())   # null: an empty document


def _gunzip_bounded(path: Path, limit: int | None = None) -> bytes:
    limit = MAX_GZIP_PARQUET_BYTES if limit is None else limit
    with gzip.open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise PrepareError(f"{path}: decompresses to more than {limit:,} bytes; refusing to hold it in memory "
                           f"(decompress it to a .parquet file and give that)")
    return data


# --- Hugging Face datasets --------------------------------------------------------------------------------------

def hf_documents(name: str, config: str | None = None, split: str | None = None, streaming: bool = False,
                 text_field: str = "text", wanted: Wanted = None,
                 max_chars: int = MAX_DOCUMENT_CHARS) -> Iterator[tuple[int, str | None]]:
    """(document number, text) of a Hugging Face dataset split, like `iter_documents`. `name` is a hub name, a
    directory written by `save_to_disk`, or a local directory of files `load_dataset` reads. `split` None: "train" of
    a hub dataset; the only split of a saved `DatasetDict` (one with several must be told which)."""
    dataset, split = _load_hf(name, config, split, streaming)
    columns = dataset.column_names
    if columns is not None and text_field not in columns:
        raise PrepareError(f"dataset {name!r}: no field {text_field!r} (found {sorted(columns)}); "
                           f"choose it with --text-field")
    where = f"dataset {name!r} split {split!r}"
    if streaming:
        for index, record in enumerate(dataset):
            if wanted is not None and not wanted(index):
                yield index, None
                continue
            if text_field not in record:
                raise PrepareError(f"{where} row {index}: no field {text_field!r} (found {sorted(record)})")
            yield index, _text(record[text_field], where, index, text_field, max_chars)
        return
    texts = dataset.select_columns([text_field])
    step = 1024
    for lo in range(0, len(texts), step):
        hi = min(lo + step, len(texts))
        if wanted is not None and not any(wanted(i) for i in range(lo, hi)):
            yield from ((i, None) for i in range(lo, hi))
            continue
        for i, text in enumerate(texts[lo:hi][text_field], lo):
            yield i, _text(text, where, i, text_field, max_chars) if wanted is None or wanted(i) else None


def _text(value, where: str, index: int, text_field: str, max_chars: int = MAX_DOCUMENT_CHARS) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PrepareError(f"{where} row {index}: field {text_field!r} is {type(value).__name__}, not text")
    if len(value) > max_chars:
        raise too_long(f"{where} row {index}", max_chars)
    return value


def chosen_split(name: str, split: str | None) -> str:
    """The split `hf_documents` reads: `split`, else a saved DatasetDict's only split, else "train"."""
    if split is not None:
        return split
    listing = Path(name) / "dataset_dict.json"
    if listing.exists():
        try:
            splits = read_regular_json(listing, what="dataset listing").get("splits") or []
        except (ValueError, AttributeError) as err:
            raise PrepareError(f"{listing}: not a dataset listing: {err}") from err
        if len(splits) == 1:
            return splits[0]
        raise PrepareError(f"dataset {name!r} holds the splits {sorted(splits)}: choose one with --split")
    return "train"


def _load_hf(name: str, config: str | None, split: str | None, streaming: bool):
    import datasets

    path = Path(name)
    try:
        if path.is_dir() and ((path / "state.json").exists() or (path / "dataset_dict.json").exists()):
            dataset = datasets.load_from_disk(str(path))     # written by save_to_disk
            if isinstance(dataset, datasets.DatasetDict):
                split = chosen_split(name, split)
                if split not in dataset:
                    raise PrepareError(f"dataset {name!r}: no split {split!r} (found {sorted(dataset)})")
                dataset = dataset[split]
            return (dataset.to_iterable_dataset() if streaming else dataset), split
        split = split or "train"
        return datasets.load_dataset(name, config, split=split, streaming=streaming,
                                     trust_remote_code=False), split
    except PrepareError:
        raise
    except Exception as err:  # datasets raises many types (FileNotFoundError, ValueError, DatasetNotFoundError...)
        raise PrepareError(f"cannot load dataset {name!r} (config {config!r}, split {split!r}): "
                           f"{type(err).__name__}: {err}") from err
