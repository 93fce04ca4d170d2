"""A prepared dataset appears whole or not at all: it is written into a staging folder beside its target and
published when everything succeeded.

Preparing straight into the target left the shards of a refused or interrupted run behind, without a manifest (4
shards and nothing else, after `--validation-every 10` on 4 files was refused). A new target is published by one
rename of the staging folder. A target that exists (a re-run into an earlier dataset's folder, which may also hold
other files) takes the new files one rename each, the old manifest removed first and the new one moved in last: no
manifest ever describes a mix of the two sets. On failure the staging folder, and any parent folder made for it,
is removed.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from mlmclm.atomic_write import dir_mode
from mlmclm.data.manifest import MANIFEST_NAME
from mlmclm.data.sources import PrepareError

SHARD_PATTERN = re.compile(r"^shard-\d{6}\.tar$")


@contextlib.contextmanager
def staged_dataset(target: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty staging folder beside `target`; publish it to `target` when the block succeeds."""
    target = Path(target).absolute()
    if target.exists() and not target.is_dir():
        raise PrepareError(f"output {target} exists and is not a folder")
    made = [p for p in reversed(target.parents) if not p.exists()]  # parents to remove again on failure
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.staging-", dir=target.parent))
    try:
        yield staging
        os.chmod(staging, dir_mode())  # mkdtemp makes 0700; published, it gets what mkdir would give
        publish(staging, target)
        made = []
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        for parent in reversed(made):
            with contextlib.suppress(OSError):  # only if still empty
                parent.rmdir()


def publish(staging: Path, target: Path) -> None:
    """Move the dataset in `staging` to `target` (see the module's docstring)."""
    if not target.exists() or (target.is_dir() and not any(target.iterdir())):
        os.replace(staging, target)
        return
    entries = sorted(staging.iterdir())
    (target / MANIFEST_NAME).unlink(missing_ok=True)
    for old in target.iterdir():  # shards of an earlier, larger dataset in this folder
        if SHARD_PATTERN.match(old.name) and not (staging / old.name).exists():
            old.unlink()
    for entry in entries:
        if entry.name == MANIFEST_NAME:
            continue
        destination = target / entry.name
        if entry.is_dir() and destination.is_dir():  # the validation split: a dataset of its own
            publish(entry, destination)
        else:
            os.replace(entry, destination)
    os.replace(staging / MANIFEST_NAME, target / MANIFEST_NAME)
