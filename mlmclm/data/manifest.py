"""The index of a prepared dataset: one JSON file next to its webdataset shards.

Shard layout (webdataset tar): each webdataset sample is a *block* of consecutive packed rows, stored as
`<key>.tokens.npy` (`dtype` [rows, seq_length]: uint16 when the vocabulary fits, else int32) and `<key>.doc_starts.npy` (int64 flat positions `row * S + col`,
col > 0, where a new document begins inside a row). Blocks keep reading at memory speed; the manifest counts
rows (samples), and `checksum` (sum of all token ids mod 2**64) lets the loader detect corrupt shards cheaply.

Versions: v1 (int32 tokens only) is still read; v2 adds uint16 tokens and the partition fields: a *part* (one job of
a partitioned preparation) records `partition` (index, count, docs per group) and `tails` (its groups' unpacked
last rows, see `mlmclm.data.partition`); a merged manifest lists `parts` and names shards by relative path.
`validation` (optional) points to the held-out split, a dataset of its own.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

MANIFEST_NAME = "manifest.json"
FORMAT = "mlmclm-packed-v2"
READABLE_FORMATS = ("mlmclm-packed-v1", FORMAT)


@dataclass
class ShardInfo:
    name: str
    num_samples: int
    num_tokens: int   # real (non-pad) tokens
    checksum: int     # sum of the shard's token ids mod 2**64 (shards.token_checksum)


@dataclass
class Manifest:
    seq_length: int
    num_samples: int
    num_tokens: int
    tokenizer: dict
    shards: list[ShardInfo]
    num_documents: int = 0
    dtype: str = "int32"
    command: str = ""
    inputs: list[str] = field(default_factory=list)
    format: str = FORMAT
    partition: dict | None = None   # a part: {"index", "count", "group_docs"}
    tails: dict | None = None       # a part: {"name", "groups", "tokens", "checksum"} of its tails file
    parts: list[str] = field(default_factory=list)   # a merged dataset: its parts' directories (relative)
    # The held-out split prepared beside it (`prepare_data --validation-every K`): {"path" (its manifest, relative),
    # "every", "num_documents", "num_samples", "num_tokens"}.
    validation: dict | None = None
    location: str = field(default="", repr=False, compare=False)  # where it was loaded from (not saved)

    def __post_init__(self):
        self.shards = [s if isinstance(s, ShardInfo) else ShardInfo(**s) for s in self.shards]

    def to_json(self) -> str:
        data = asdict(self)
        data.pop("location")
        return json.dumps(data, indent=1, sort_keys=True) + "\n"

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically (temporary name, then rename). `path` is a directory or a .json file."""
        path = Path(path)
        if path.suffix != ".json":
            path = path / MANIFEST_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            f.write(self.to_json())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path_or_url: str | os.PathLike) -> "Manifest":
        """From a dataset directory, a manifest file, or a webdataset URL (`pipe:...`, `http(s)://...`)."""
        location = manifest_location(str(path_or_url))
        try:
            if is_url(location):
                from webdataset.gopen import gopen

                with gopen(location, "rb") as stream:
                    text = stream.read().decode("utf-8")
            else:
                text = Path(location).read_text(encoding="utf-8")
            data = json.loads(text)
        except (OSError, ValueError) as err:
            raise ValueError(f"cannot read dataset manifest {location}: {err}") from err
        if not isinstance(data, dict) or data.get("format") not in READABLE_FORMATS:
            found = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"{location}: unknown manifest format {found!r} (readable: {', '.join(READABLE_FORMATS)})")
        try:
            manifest = cls(**data)
        except TypeError as err:
            raise ValueError(f"{location}: malformed manifest ({err})") from err
        manifest.location = location
        return manifest

    def shard_url(self, name: str) -> str:
        """Shards live next to the manifest: replace the manifest's file name in its location (works for pipes)."""
        head, sep, tail = self.location.rpartition(MANIFEST_NAME)
        if not sep:
            raise ValueError(f"cannot locate shards relative to {self.location!r} (it does not name {MANIFEST_NAME})")
        return head + name + tail


def is_url(location: str) -> bool:
    return "://" in location or location.startswith("pipe:")


def manifest_location(path_or_url: str) -> str:
    if is_url(path_or_url) or path_or_url.endswith(".json"):
        return path_or_url
    return str(Path(path_or_url) / MANIFEST_NAME)
