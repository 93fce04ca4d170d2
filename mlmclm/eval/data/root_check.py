"""What a data root's manifest says, checked before any of it is used.

A data root (`tools/evaluate.py fetch --out DIR`) may come from others: copied between machines, shared on a
cluster. Its manifest is checked for its shape (a wrong one gave an AttributeError).
"""
from __future__ import annotations

from pathlib import Path


class RootCheckError(ValueError):
    """A data root's manifest is malformed, or its files are not what it records."""


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_shape(manifest, path: Path) -> dict:
    """`manifest` if it has the shape fetch writes: {"repos": {repo: {"revision": str, "complete": bool,
    "files": {name: {"rows": int, "bytes": int}}}}}; else a RootCheckError naming the file and the field."""
    if not isinstance(manifest, dict) or not isinstance(manifest.get("repos"), dict):
        raise RootCheckError(f"{path}: not a data root manifest: expected an object with a 'repos' object (what "
                             f"`tools/evaluate.py fetch` writes)")
    for repo, entry in manifest["repos"].items():
        where = f"{path}: repos[{repo!r}]"
        if not isinstance(entry, dict):
            raise RootCheckError(f"{where} is not an object")
        if not isinstance(entry.get("revision"), str) or not isinstance(entry.get("complete"), bool):
            raise RootCheckError(f"{where}: 'revision' must be a string and 'complete' true or false")
        files = entry.get("files")
        if not isinstance(files, dict):
            raise RootCheckError(f"{where}: 'files' must be an object (file name -> rows and bytes)")
        for name, info in files.items():
            if not (isinstance(info, dict) and _count(info.get("rows")) and _count(info.get("bytes"))):
                raise RootCheckError(f"{where}.files[{name!r}]: expected {{\"rows\": N, \"bytes\": N}} (counts), "
                                     f"got {info!r}")
    return manifest

