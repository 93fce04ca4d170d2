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
    files = matching_files(root, pattern)
    rows, names = [], {}
    for path in files:
        table = read_parquet_table(path)
        names = names or class_label_names(table.schema)
        rows += table.to_pylist()
    return rows, names, files


def read_qrels(root: Path, pattern: str) -> list[tuple[str, str, int]]:
    """(query id, document id, score) per judgement of a BEIR qrels TSV (header `query-id corpus-id score`)."""
    judgements = []
    for path in matching_files(root, pattern):
        with open_data_text(path, "qrels file", newline="") as handle:
            reader = csv.DictReader(handle, delimiter="\t")
            missing = {"query-id", "corpus-id", "score"} - set(reader.fieldnames or ())
            if missing:
                raise HubLayoutError(f"{path}: qrels header lacks {sorted(missing)} (have {reader.fieldnames})")
            for line, row in enumerate(reader, start=2):
                try:
                    judgements.append((str(row["query-id"]), str(row["corpus-id"]), int(row["score"])))
                except (TypeError, ValueError) as err:
                    raise HubLayoutError(f"{path}:{line}: bad qrels row {row} ({err})") from err
    return judgements
