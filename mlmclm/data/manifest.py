"""The index of a prepared dataset: one JSON file next to its webdataset shards.

Shard layout (webdataset tar): each webdataset sample is a *block* of consecutive packed rows, stored as
`<key>.tokens.npy` (`dtype` [rows, seq_length]: uint16 when the vocabulary fits, else int32) and `<key>.doc_starts.npy` (int64 flat positions `row * S + col`,
col > 0, where a new document begins inside a row). Blocks keep reading at memory speed; the manifest counts
rows (samples), and `checksum` (sum of all token ids mod 2**64) lets the loader detect corrupt shards cheaply.

Versions: v1 (int32 tokens only) is still read; v2 adds uint16 tokens and the partition fields: a *part* (one job of
a partitioned preparation) records `partition` (index, count, docs per group) and `tails` (its groups' unpacked
last rows, see `mlmclm.data.partition`); a merged manifest lists `parts` and names shards by relative path.
`validation` (optional) points to the held-out split, a dataset of its own.

Every name a manifest contributes to a location (a shard's `name`, `parts`, `validation.path`, `tails.name`) is
spliced into the dataset's location: for a `pipe:` dataset into a shell command every rank runs, for http(s) into a
URL. A manifest is a file from others, so `load` refuses any such name that is not a plain relative path inside the
dataset (see `check_relative_name`) before a shard is opened or a command runs.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mlmclm.atomic_write import write_atomic
from mlmclm.bounded_read import FileRefusedError, read_regular_file
from mlmclm.data.remote import MANIFEST_LIMIT, read_stream
from mlmclm.path_names import PLAIN_NAME

MANIFEST_NAME = "manifest.json"
FORMAT = "mlmclm-packed-v2"
READABLE_FORMATS = ("mlmclm-packed-v1", FORMAT)
# One component of a name our tools write (shard-000000.tar, part-00000-of-00004, tails.npz, manifest.json): a plain
# name, which means nothing to a shell or in a URL (mlmclm/path_names.py).
NAME_COMPONENT = PLAIN_NAME


def check_relative_name(value, where: str) -> str:
    """`value` if it is a relative path of plain components (`NAME_COMPONENT`, joined by "/"), else a ValueError
    naming `where` (the manifest and the field) and the value. Such a name stays inside the dataset's directory,
    and substituted into a shell command or a URL it stays one word of the same command, one path of the same URL."""
    if not isinstance(value, str):
        raise ValueError(f"{where}: {value!r} is not a file name")
    bad = [part for part in value.split("/") if not NAME_COMPONENT.fullmatch(part)]
    if bad:
        why = ("an absolute path" if value.startswith("/") else "'..' leaves the dataset" if ".." in bad
               else ("it" if bad[0] == value else f"its component {bad[0]!r}")
               + " is not a plain name (letters, digits, '.', '_', '-'; not starting with '.' or '-')")
        raise ValueError(f"{where}: refusing {value!r}: {why}. A manifest may only name files inside its dataset, "
                         "as prepare_data writes them (shard-000000.tar, part-00000-of-00002/shard-000000.tar, "
                         "validation/manifest.json)")
    return value


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
        write_atomic(path, self.to_json())   # as open under the user's umask (it records inputs and the command)
        return path

    @classmethod
    def load(cls, path_or_url: str | os.PathLike) -> "Manifest":
        """From a dataset directory, a manifest file, or a webdataset URL (`pipe:...`, `http(s)://...`)."""
        location = manifest_location(str(path_or_url))
        try:  # bounded: a manifest from others may be /dev/zero, a FIFO or an endless response
            raw = (read_stream(location, MANIFEST_LIMIT, "dataset manifest") if is_url(location)
                   else read_regular_file(location, MANIFEST_LIMIT, "dataset manifest"))
            data = json.loads(raw.decode("utf-8"))
        except FileRefusedError as err:   # names the manifest and why
            raise ValueError(str(err)) from None
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
        manifest.check_names()
        return manifest

    def check_names(self) -> None:
        """Every name this manifest adds to a location passes `check_relative_name` (ValueError otherwise)."""
        where = self.location or "manifest"
        for i, shard in enumerate(self.shards):
            check_relative_name(shard.name, f"{where}: shards[{i}].name")
        for i, part in enumerate(self.parts):
            check_relative_name(part, f"{where}: parts[{i}]")
        for field_name, record, key in (("validation", self.validation, "path"), ("tails", self.tails, "name")):
            if record is None:
                continue
            if not isinstance(record, dict) or key not in record:
                raise ValueError(f"{where}: {field_name} must be an object with a {key!r}, found {record!r}")
            value = record[key]
            if field_name == "validation" and self.partition is not None and isinstance(value, str):
                # A part's split lies beside the part, in OUT/validation/<part>/ (prepare's layout): one level up.
                value = value[3:] if value.startswith("../validation/") else value
            check_relative_name(value, f"{where}: {field_name}.{key}")

    def shard_url(self, name: str) -> str:
        """Shards live next to the manifest: replace the manifest's file name in its location (works for pipes).
        `name` must pass `check_relative_name`, so it cannot turn the location into another command or URL."""
        check_relative_name(name, f"{self.location or 'manifest'}: location of {name!r}")
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
