"""What a data root's manifest says, checked against the folder before any of it is read.

A data root (`tools/evaluate.py fetch --out DIR`) may come from others: copied between machines, shared on a
cluster. Its manifest is checked for its shape (a wrong one gave an AttributeError), and a repository's folder
against its manifest entry: every listed file a regular file inside the data root (a symlink out of it is refused:
the suite would read whatever it points at), holding the bytes and rows recorded (999,999 claimed rows were
accepted), and no unlisted file where the suite's globs would read it (an added shard would add rows silently).
"""
from __future__ import annotations

import fnmatch
import os
import stat
from pathlib import Path

from mlmclm.eval.data.data_files import open_data_file


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


def count_rows(path: Path) -> int:
    """Rows of a suite file as fetch counts them: a parquet file's recorded rows, a TSV's lines less its header."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        with open_data_file(path) as handle:
            return pq.ParquetFile(handle).metadata.num_rows
    with open_data_file(path) as handle:
        return sum(1 for _ in handle) - 1


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def check_repo_files(data_root: Path, repo: str, entry: dict, globs: tuple[str, ...], manifest_path: Path) -> None:
    """The folder `data_root/repo` holds exactly the files `entry` lists (where `globs` would read), each a regular
    file inside the data root with the recorded bytes and rows."""
    root = Path(data_root).resolve()
    folder = Path(data_root) / repo
    for name, info in entry["files"].items():
        path = folder / name
        where = f"{path} (listed in {manifest_path})"
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError) as err:
            raise RootCheckError(f"{where}: missing or unreadable ({err.__class__.__name__}); fetch again") from None
        if not _inside(real, root):
            raise RootCheckError(f"{where}: refusing to read it: it leads out of the data root {root} (to {real})")
        info_now = os.stat(real)
        if not stat.S_ISREG(info_now.st_mode):
            raise RootCheckError(f"{where}: refusing to read it: not a regular file")
        if info_now.st_size != info["bytes"]:
            raise RootCheckError(f"{where}: holds {info_now.st_size} bytes, the manifest records {info['bytes']}: "
                                 f"the folder is not what fetch wrote; fetch again")
        rows = count_rows(real)
        if rows != info["rows"]:
            raise RootCheckError(f"{where}: holds {rows} rows, the manifest records {info['rows']}: the folder is "
                                 f"not what fetch wrote; fetch again")
    if folder.is_dir():
        for path in sorted(folder.rglob("*")):
            name = path.relative_to(folder).as_posix()
            if name not in entry["files"] and any(fnmatch.fnmatchcase(name, glob) for glob in globs) \
                    and not path.is_dir():
                raise RootCheckError(f"{path}: not listed in {manifest_path}, yet the suite would read it: refusing "
                                     f"the data root (fetch again into an empty folder)")
