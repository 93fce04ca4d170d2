"""`tools/evaluate.py fetch`: every file the paper suite reads, from the hub onto local disk, for offline runs.

Per repository (sources.REPOS): the revision is its pin, or — unpinned — the commit its branch points at now,
resolved once and recorded; its files (the globs of `Repo.files`) are downloaded one by one into
`OUT/.partial/<repo>/` (each written as `<file>.part`, then renamed: a re-run resumes at the first missing file);
the retrieval corpora and query files are cut shard by shard to the documents the protocol uses (retrieval_sets.py:
judged ids of the qrels, MLDR's positives), so an 8.8 M-passage corpus never lands whole on disk beside its cut;
then the folder is renamed to `OUT/<repo>/` and `OUT/manifest.json` (written to a temporary name, then renamed)
records its revision, files, rows and bytes. Nothing half-written ever sits under a final name. Nothing of anyone
else's under OUT is deleted: `OUT/<repo>/` is replaced only when it holds just the files the manifest records, a
`.partial` folder fetch did not make is refused, and only its own marker and empty folders are removed from it.
"""
from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tqdm.auto import tqdm

from mlmclm.atomic_write import write_atomic
from mlmclm.eval.data.data_root import MANIFEST
from mlmclm.eval.data.hub_files import read_parquet, read_qrels
from mlmclm.eval.data.retrieval_sets import filtered_shard, mldr_ids
from mlmclm.eval.data.sources import REPOS, task_repos
from mlmclm.output_apart import check_output_apart

PARTIAL = ".partial"
PARTIAL_MARKER = ".made-by-fetch"  # in OUT/.partial: the folder is ours, its files are our downloads
FIX = ("run `tools/evaluate.py fetch --suite paper --out DIR` on a machine that reaches huggingface.co (set "
       "HF_ENDPOINT for a mirror, unset HF_HUB_OFFLINE), copy DIR to the cluster, then pass --data-root DIR")


class FetchError(RuntimeError):
    """The hub could not be reached, or a repository does not hold what the suite reads."""


@dataclass(frozen=True)
class Hub:
    """How fetch reaches repositories: the commit a ref points at, the files at a commit, one file's download."""

    resolve: Callable[[str, str], str]
    list_files: Callable[[str, str], list[str]]
    download: Callable[[str, str, str, Path], Path]
    folder: Path | None = None  # a mirror's folder: what fetch reads, so never its output


def huggingface_hub(endpoint: str | None = None) -> Hub:
    from huggingface_hub import HfApi, hf_hub_download

    api = HfApi(endpoint=endpoint)
    return Hub(
        resolve=lambda repo, ref: api.dataset_info(repo, revision=ref).sha,
        list_files=lambda repo, sha: api.list_repo_files(repo, repo_type="dataset", revision=sha),
        download=lambda repo, sha, name, folder: Path(hf_hub_download(
            repo, name, repo_type="dataset", revision=sha, local_dir=folder, endpoint=endpoint)))


def mirror(folder: Path, revisions: dict[str, str]) -> Hub:
    """A folder holding each repository's files as `<folder>/<repo>/<path>` at the given commits (a copy of hub
    snapshots): the same contract as the hub, for machines that see such a copy but not the hub."""
    folder = Path(folder)

    def files(repo: str, sha: str) -> list[str]:
        root = folder / repo
        return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())

    def download(repo: str, sha: str, name: str, into: Path) -> Path:
        target = Path(into) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(folder / repo / name, target)
        return target

    return Hub(resolve=lambda repo, ref: revisions[repo], list_files=files, download=download, folder=folder)


def suite_repos(tasks: list[str]) -> list[str]:
    """The repositories of `tasks` (msmarco brings nq and mldr_en), ordered so that every qrels repository comes
    before the corpus it cuts."""
    names = set(tasks) | ({"nq", "mldr_en"} if "msmarco" in tasks else set())
    repos = {repo for task in names for repo in task_repos(task)}
    corpora = ("BeIR/msmarco", "BeIR/nq")
    return sorted(r for r in repos if r not in corpora) + [r for r in corpora if r in repos]


def _cut_rule(repo: str, name: str, out: Path, partial: Path) -> tuple[str, set[str]] | None:
    """(id column, ids to keep) for a file fetch cuts, else None (kept whole)."""
    def qrels(qrels_repo: str, files: tuple[str, ...]) -> list[tuple[str, str, int]]:
        return [j for f in files for j in read_qrels(out / qrels_repo, f)]

    if repo in ("BeIR/msmarco", "BeIR/nq"):
        judged = qrels(f"{repo}-qrels", ("dev.tsv", "test.tsv") if repo == "BeIR/msmarco" else ("test.tsv",))
        if name.startswith("corpus/"):
            return "_id", {doc for _, doc, _ in judged}
        if name.startswith("queries/"):
            return "_id", {query for query, _, _ in judged}
    if repo == "hgissbkh/mldr-en" and name.startswith("corpus/"):
        return "docid", mldr_ids({split: read_parquet(partial, f"default/{split}/*.parquet")[0]
                                  for split in ("dev", "test")})
    return None


def _rows_of(path: Path) -> int:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    with path.open(encoding="utf-8") as handle:
        return sum(1 for _ in handle) - 1  # qrels TSV: minus its header


def _write_manifest(out: Path, manifest: dict) -> None:
    write_atomic(out / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True))


def _resolve(hub: Hub, repo: str) -> str:
    source = REPOS[repo]
    if source.revision is not None:
        return source.revision
    try:
        return hub.resolve(repo, source.ref)
    except Exception as err:  # noqa: BLE001 - any failure to reach the hub gets the same cause-and-fix message
        raise FetchError(f"cannot reach the hub for {repo} ({type(err).__name__}: {err}); {FIX}") from err


def _check_replaceable(final: Path, recorded: dict | None) -> None:
    """`OUT/<repo>` may be replaced only when it holds nothing but the files OUT/manifest.json records for it:
    anything else there is someone's, and would be deleted with it."""
    known = set((recorded or {}).get("files") or {})
    others = sorted(p.relative_to(final).as_posix() for p in final.rglob("*")
                    if not p.is_dir() and p.relative_to(final).as_posix() not in known)
    if recorded is None or others:
        what = f"{others[0]!r}" + (f" and {len(others) - 1} more" if len(others) > 1 else "") if others else "files"
        raise FetchError(f"{final} holds {what} that fetch did not write (OUT/manifest.json does not record "
                         f"{'them' if others else 'this folder'}): fetching would replace the folder; move it away "
                         f"or choose another --out")


def fetch_repo(hub: Hub, repo: str, revision: str, out: Path, progress: bool, recorded: dict | None = None) -> dict:
    """Download (and cut) one repository's suite files into OUT/.partial/<repo>, then rename it to OUT/<repo>
    (`recorded`: the manifest's entry of an earlier fetch, whose files alone may be replaced)."""
    partial = out / PARTIAL / repo
    final = out / repo
    if final.exists():  # before any download: nothing of someone else's is replaced
        _check_replaceable(final, recorded)
    wanted = REPOS[repo].files
    try:
        listed = hub.list_files(repo, revision)
    except Exception as err:  # noqa: BLE001
        raise FetchError(f"cannot list {repo}@{revision} ({type(err).__name__}: {err}); {FIX}") from err
    files = sorted((f for f in listed if any(fnmatch.fnmatchcase(f, g) for g in wanted)),
                   key=lambda f: (f.startswith("corpus/"), f))  # MLDR: its dev/test before the corpus they cut
    for glob in wanted:
        if not any(fnmatch.fnmatchcase(f, glob) for f in files):
            raise FetchError(f"{repo}@{revision} has no file matching {glob!r} (its layout changed?); the suite "
                             f"reads {list(wanted)}")
    entry = {"revision": revision, "files": {}, "complete": False}
    for name in tqdm(files, desc=repo, unit="file", disable=not progress, leave=False):
        target = partial / name
        if not target.exists():  # resume: files already renamed into .partial are complete
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=out / PARTIAL) as scratch:
                downloaded = hub.download(repo, revision, name, Path(scratch))
                part = target.with_name(target.name + ".part")
                rule = _cut_rule(repo, name, out, partial)
                if rule is None:
                    shutil.move(str(downloaded), part)
                else:
                    import pyarrow.parquet as pq

                    pq.write_table(filtered_shard(downloaded, rule[0], rule[1]), part)
                os.replace(part, target)
        entry["files"][name] = {"rows": _rows_of(target), "bytes": target.stat().st_size}
    if final.exists():
        shutil.rmtree(final)  # our files of another revision, replaced (its manifest entry is rewritten below)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, final)
    entry["complete"] = True
    return entry


def fetch_suite(out: Path, tasks: list[str], hub: Hub | None = None, progress: bool | None = None) -> dict:
    """Fetch every repository of `tasks` into `out` (resumable); returns the manifest."""
    out = Path(out)
    progress = sys.stderr.isatty() if progress is None else progress
    hub = hub or huggingface_hub()
    check_output_apart(out, {"mirror": hub.folder})  # its repositories would be replaced by their copies
    if not progress:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    repos = suite_repos(tasks)
    revisions = {repos[0]: _resolve(hub, repos[0])}  # first contact: no network fails here, before any write
    path = out / MANIFEST
    manifest = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"repos": {}}
    if not isinstance(manifest, dict) or not isinstance(manifest.get("repos"), dict):
        raise FetchError(f"{path} is not a manifest fetch writes (no 'repos'): choose another --out")
    partial_root = out / PARTIAL
    if partial_root.exists() and not (partial_root / PARTIAL_MARKER).exists():
        raise FetchError(f"{partial_root} exists and was not made by fetch: its files would be taken for downloads "
                         f"and removed; move it away or choose another --out")
    partial_root.mkdir(parents=True, exist_ok=True)
    (partial_root / PARTIAL_MARKER).touch()
    for repo in tqdm(repos, desc="fetch", unit="repo", disable=not progress):
        revision = revisions.get(repo) or _resolve(hub, repo)
        done = manifest["repos"].get(repo, {})
        if done.get("complete") and done.get("revision") == revision and (out / repo).is_dir():
            continue
        manifest["repos"][repo] = fetch_repo(hub, repo, revision, out, progress, done or None)
        _write_manifest(out, manifest)
    _remove_partial(partial_root)
    return manifest


def _remove_partial(root: Path) -> None:
    """Remove OUT/.partial once every repository is in place: our marker and the folders left empty, never a file
    (nothing of ours is left in it by then; anything else is not ours to delete)."""
    (root / PARTIAL_MARKER).unlink(missing_ok=True)
    for folder in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()
    with contextlib.suppress(OSError):
        root.rmdir()


def manifest_bytes(manifest: dict) -> int:
    return sum(f["bytes"] for entry in manifest["repos"].values() for f in entry["files"].values())
