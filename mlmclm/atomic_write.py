"""Writing a file atomically, through a temporary file nobody else can have planted.

A fixed temporary name (`shard-000000.tar.tmp`, `run_status.json.tmp`) in a folder others may write to (a shared
data or output folder) can be planted beforehand as a symlink to a file of the user's: opening it for writing
follows the link and overwrites that file. Here the temporary file is created by `tempfile.mkstemp`: a random name
beside the target, opened with O_CREAT | O_EXCL (an existing name, a link included, is never opened), then renamed
over the target. Its mode is what an ordinary `open` would give under the user's umask (mkstemp's 0600 would be
less open than asked, a fixed 0644 more open than a umask of 077 allows).
"""
from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

TEMP_SUFFIX = ".tmp"


def current_umask() -> int:
    """The process's umask, read without changing it (Linux: /proc/self/status; elsewhere set and restored)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode `open(path, "w")` gives a new file: 0666 less the umask."""
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    """The mode `mkdir` gives a new folder: 0777 less the umask."""
    return 0o777 & ~current_umask()


def temp_pattern(name: str) -> str:
    """A glob that matches the temporary files `atomic_file` makes for a target named `name` (to clean leftovers)."""
    return f".{name}.*{TEMP_SUFFIX}"


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", encoding: str | None = "utf-8"):
    """A new, exclusively created temporary file beside `path`, opened with `mode` ("w" or "wb"); renamed over
    `path` when the block ends without error, removed otherwise."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        os.fchmod(fd, file_mode())
        with os.fdopen(fd, mode, encoding=None if "b" in mode else encoding) as stream:
            fd = -1
            yield stream
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike, data: str | bytes, encoding: str = "utf-8") -> None:
    """`data` into `path` through `atomic_file`: readers see the old file or the whole new one, never a part."""
    with atomic_file(path, "wb" if isinstance(data, bytes) else "w", encoding) as stream:
        stream.write(data)
