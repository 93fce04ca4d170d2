"""Before a local launch: every task's data path holds a dataset (tiny recipes may pack the embedded corpus)."""
from __future__ import annotations

from pathlib import Path

import nemo_run as run

from mlmclm.data.manifest import MANIFEST_NAME
from recipes import registry


def is_local_path(path: str) -> bool:
    return "://" not in path and not path.startswith("pipe:")


def prepare_local_data(names: list[str], partials: list[run.Partial], prepare: bool = False) -> None:
    """Check, before a local launch, that every task's data path holds a dataset (its manifest.json).

    The tiny recipes pack the embedded corpus when asked to: at their own default path, or anywhere with
    `prepare=True` (`--prepare-data`). Nowhere else is data invented, and a non-empty directory that is not a
    dataset is refused, never written into.
    """
    for name, partial in zip(names, partials):
        recipe = registry.get(name)
        path = str(partial.config.data.path)
        if not is_local_path(path) or (Path(path) / MANIFEST_NAME).exists():
            continue
        default = recipe.parameters().get("data_path")
        at_default = isinstance(default, str) and Path(default).resolve() == Path(path).resolve()
        if recipe.prepare is not None and (prepare or at_default):
            recipe.prepare(path)
            continue
        raise ValueError(f"{name}: {not_a_dataset(path)}" + ("; pass --prepare-data to pack the embedded corpus there"
                         if recipe.prepare is not None and not Path(path).is_file() and not _non_empty(path) else "")
                         + " (or prepare a dataset with tools/prepare_data.py)")


def _non_empty(path: str | Path) -> bool:
    return Path(path).is_dir() and any(Path(path).iterdir())


def not_a_dataset(path: str | Path) -> str:
    """Why `path` (which has no manifest) is not a dataset, in words."""
    path = Path(path)
    if not path.exists():
        return f"data_path {path} does not exist"
    if not path.is_dir():
        return f"data_path {path} is a file, not a dataset directory"
    if _non_empty(path):
        return (f"data_path {path} is a non-empty directory that is not a dataset (no {MANIFEST_NAME}); refusing to "
                f"write into it")
    return f"data_path {path} is an empty directory (no {MANIFEST_NAME})"
