"""Where a paper source's files are read from: a folder written by `tools/evaluate.py fetch` (offline; its
manifest records the revision and rows of every repository) or, without one, a hub snapshot at the pinned revision
(network). Both hand the same hub-layout folder to the readers of sources.py."""
from __future__ import annotations

import json
from pathlib import Path

from mlmclm.bounded_read import read_regular_json
from mlmclm.eval.data.root_check import check_repo_files, check_shape
from mlmclm.eval.data.sources import REPOS, RootOf

MANIFEST = "manifest.json"


class DataRootError(ValueError):
    """A data folder is missing, incomplete, or holds other revisions than the pins."""


def read_manifest(data_root: Path) -> dict:
    path = Path(data_root) / MANIFEST
    if not path.exists():
        raise DataRootError(f"{data_root}: no {MANIFEST}: --data-root takes a folder written by "
                            f"`tools/evaluate.py fetch --suite paper --out {data_root}`")
    try:
        manifest = read_regular_json(path, what="data root manifest")  # bounded: a FIFO must not block the run
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataRootError(f"{path}: not valid JSON ({err})") from err
    return check_shape(manifest, path)


def check_manifest(data_root: Path, repos: list[str], allow_other_revisions: bool = False) -> dict:
    """The manifest, after checking it holds every repo asked for, complete, at the pinned revision (an
    unpinned repo accepts the revision fetch recorded). A disagreement names the repo and is refused unless
    `allow_other_revisions`."""
    manifest = read_manifest(data_root)
    entries = manifest["repos"]
    for repo in repos:
        entry = entries.get(repo)
        if entry is None or not entry.get("complete"):
            raise DataRootError(f"{data_root}: {repo} was not fetched (completely); re-run "
                                f"`tools/evaluate.py fetch --suite paper --out {data_root}` (it resumes)")
        pin = REPOS[repo].revision
        if pin is not None and entry.get("revision") != pin and not allow_other_revisions:
            raise DataRootError(f"{data_root}: {repo} holds revision {entry.get('revision')} but the suite pins "
                                f"{pin}; fetch again, or pass --allow-other-revisions to evaluate on it anyway")
        check_repo_files(data_root, repo, entry, REPOS[repo].files, Path(data_root) / MANIFEST)
    return manifest


def fetched_root(data_root: Path, allow_other_revisions: bool = False) -> RootOf:
    def root_of(repo: str) -> tuple[Path, str]:
        manifest = check_manifest(data_root, [repo], allow_other_revisions)
        return Path(data_root) / repo, manifest["repos"][repo]["revision"]
    return root_of


def hub_root(repo: str) -> tuple[Path, str]:
    """A snapshot of `repo`'s suite files at its pin (else its branch), from the hub or the local HF cache."""
    from huggingface_hub import snapshot_download

    source = REPOS[repo]
    folder = Path(snapshot_download(repo, repo_type="dataset", revision=source.revision or source.ref,
                                    allow_patterns=list(source.files)))
    return folder, folder.name  # the snapshot folder is named by the commit it holds
