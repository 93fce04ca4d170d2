"""Reading a dataset repository's files as the Hugging Face hub lays them out: parquet shards (a repo's own, or the
parquet export of a script-based repo, `refs/convert/parquet`: `<config>/<split>/NNNN.parquet`) with the `datasets`
features stored in their schema, and BEIR's qrels TSVs. Plain data only: no dataset script ever runs."""
from __future__ import annotations

import csv
import fnmatch
import json
from pathlib import Path
from typing import Any

from mlmclm.eval.data.data_files import open_data_text, read_parquet_table


class HubLayoutError(ValueError):
    """A repository folder lacks the files its source expects, or they do not hold what they should."""


def matching_files(root: Path, pattern: str) -> list[Path]:
    """The files under `root` whose repo-relative path matches the glob `pattern`, in path order (shard order)."""
    root = Path(root)
    if not root.is_dir():
        raise HubLayoutError(f"{root} does not exist (expected a hub snapshot or a folder written by "
                             f"`tools/evaluate.py fetch`)")
    found = sorted(p for p in root.rglob("*") if p.is_file()
                   and fnmatch.fnmatchcase(p.relative_to(root).as_posix(), pattern))
    if not found:
        raise HubLayoutError(f"{root}: no file matches {pattern!r}")
    return found


def class_label_names(schema) -> dict[str, list[str]]:
    """Column -> label names of the ClassLabel columns (or sequences of ClassLabel) that `datasets` recorded in a
    parquet file's schema metadata (key b"huggingface"); columns without names are absent."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if raw is None:
        return {}
    features = json.loads(raw).get("info", {}).get("features", {})
    names = {}
    for column, feature in features.items():
        while isinstance(feature, dict) and "names" not in feature and "feature" in feature:
            feature = feature["feature"]  # Sequence / List of ClassLabel
        if isinstance(feature, dict) and isinstance(feature.get("names"), list):
            names[column] = list(feature["names"])
    return names


def read_parquet(root: Path, pattern: str) -> tuple[list[dict[str, Any]], dict[str, list[str]], list[Path]]:
    """(rows, ClassLabel names per column, files read) of every shard matching `pattern`."""
    rows, names, files, _ = read_parquet_located(root, pattern)
    return rows, names, files


def read_parquet_located(root: Path, pattern: str
                         ) -> tuple[list[dict[str, Any]], dict[str, list[str]], list[Path], list[str]]:
    """`read_parquet`, plus where each row came from (`file row n`, 1-based), for errors that name the row."""
    files = matching_files(root, pattern)
    rows, names, locations = [], {}, []
    for path in files:
        table = read_parquet_table(path)
        names = names or class_label_names(table.schema)
        rows += table.to_pylist()
        locations += [f"{path} row {number}" for number in range(1, table.num_rows + 1)]
    return rows, names, files, locations


def tag_names(ids: list, names: list[str], where: str) -> list:
    """A row's tag ids as the dataset's ClassLabel names (a value already a name is kept). An id outside the names
    is refused naming the row: Python's indexing made -1 silently the last tag and 42 an IndexError."""
    out = []
    for position, tag in enumerate(ids, start=1):
        if isinstance(tag, int) and not isinstance(tag, bool):
            if not 0 <= tag < len(names):
                raise HubLayoutError(f"{where}: tag id {tag} (token {position}) is outside the dataset's "
                                     f"{len(names)} tag names (ids 0 to {len(names) - 1})")
            tag = names[tag]
        out.append(tag)
    return out


def read_qrels(root: Path, pattern: str) -> list[tuple[str, str, int]]:
    """(query id, document id, score) per judgement of a BEIR qrels TSV (header `query-id corpus-id score`)."""
    judgements = []
    for path in matching_files(root, pattern):
        with open_data_text(path, "qrels file", newline="") as handle:
            reader = csv.DictReader(handle, delimiter="\t")
            try:
                missing = {"query-id", "corpus-id", "score"} - set(reader.fieldnames or ())
                if missing:
                    raise HubLayoutError(f"{path}: qrels header lacks {sorted(missing)} (have {reader.fieldnames})")
                for row in reader:
                    try:
                        judgements.append((str(row["query-id"]), str(row["corpus-id"]), int(row["score"])))
                    except (TypeError, ValueError) as err:
                        raise HubLayoutError(f"{path}:{reader.line_num}: bad qrels row ({err})") from None
            except (csv.Error, UnicodeDecodeError) as err:
                # csv's own refusals (a field over its 128 KiB limit, a NUL) name neither the file nor the line (the
                # line being read when it fails is the one after line_num)
                raise HubLayoutError(f"{path}:{reader.line_num + 1}: not a qrels TSV ({err})") from None
    return judgements
