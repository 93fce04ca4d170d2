"""Reading a checkpoint never runs code stored in it.

megatron's `torch_dist` format is PyTorch Distributed Checkpoint, and three readers in that stack unpickle what a
checkpoint's author wrote: DCP's `FileSystemReader.read_metadata` (`pickle.load` of `.metadata`), DCP's
`DefaultLoadPlanner.load_bytes` (`torch.load(weights_only=False)` of every non-tensor item; megatron's planner
inherits it), and Transformer Engine's `set_extra_state` (`pickle.loads` of each module's FP8 metadata). A pickle can
import and call anything, so each of these would run a hostile checkpoint's code before any check of ours.

`install()` replaces the first two, process-wide, with readers that cannot execute code (mlmclm.train.safe_unpickle):
- `.metadata` is unpickled with `find_class` limited to the DCP metadata classes, torch dtypes and `torch.Size`
  (`METADATA_GLOBALS`). A pickle runs code only through a global it imports, so a hostile one is refused at its first
  other import, before any of its code has run; the error names the file and the import.
- byte items are read with torch's weights-only unpickler (its own allow-list: containers, numbers, strings, tensors).
`te_extra_state.safe_extra_state` decodes a TE extra state the same way — a tensor of any dtype, as TE and megatron
read any — and hands TE a re-serialised copy of what it decoded, so TE's own `pickle.loads` only ever sees bytes we
wrote. TE >= 2.18 refuses any delayed-scaling payload in `set_extra_state` unless
NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1 (`transformer_engine/pytorch/_extra_state.py`), so
`te_extra_state.load_vetted_state` sets that variable for the one `load_state_dict` call that hands TE those copies —
only when every non-empty extra state in it is one `safe_extra_state` produced, and restored right after.
This module also refuses, before megatron's loader runs, a checkpoint directory whose files could block or exhaust a
rank (`check_checkpoint`).

Not covered: anything outside these readers (a tokenizer's files are read by `transformers`, which runs no remote
code unless asked; `safetensors` files hold no code). Paths inside `.metadata` are taken as written: a hostile one can
make DCP read another file as tensor data (read with `weights_only=True`, so it cannot run code either).
"""
from __future__ import annotations

import contextvars
import io
import os
from pathlib import Path

from torch.distributed.checkpoint import filesystem as dcp_filesystem
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import ReadItem

from mlmclm.bounded_read import FileRefusedError, SMALL_FILE_LIMIT, check_regular_file, read_limited, read_regular_file
# UnsafeCheckpointError is what every reader of a checkpoint from others catches (export, evaluation): named here too
from mlmclm.train.safe_unpickle import UnsafeCheckpointError, read_metadata_bytes, weights_only_load  # noqa: F401


def read_metadata_file(path: str | Path):
    """The DCP `Metadata` of the checkpoint directory `path`, unpickled with the allow-list."""
    file = Path(path) / ".metadata"
    return read_metadata_bytes(_read_bounded(file, METADATA_LIMIT, "checkpoint index"), str(file))


# DCP's index grows with the number of tensors (a few MB for a 1B model with its optimizer); a byte item is a small
# pickled state (the common state, an RNG state). Far more than ours ever hold, far less than exhausts a node.
METADATA_LIMIT = 256 * 1024 * 1024
BYTE_ITEM_LIMIT = 64 * 1024 * 1024


def _read_bounded(file: Path, limit: int, what: str) -> bytes:
    try:
        return read_regular_file(file, limit, what)
    except FileRefusedError as err:
        raise UnsafeCheckpointError(str(err)) from None


def refuse_special_files(path: str | Path) -> None:
    """Every file of the checkpoint directory is a regular file: a FIFO would block the rank that opens it (on a
    cluster until the NCCL timeout), a device such as /dev/zero never ends; and the small JSON files megatron and we
    read whole hold at most SMALL_FILE_LIMIT bytes."""
    for folder, _, names in os.walk(path):
        for name in names:
            file = Path(folder) / name
            try:
                info = check_regular_file(file, "checkpoint file")
            except FileRefusedError as err:
                raise UnsafeCheckpointError(str(err)) from None
            if name.endswith(".json") and info.st_size > SMALL_FILE_LIMIT:
                raise UnsafeCheckpointError(f"{file}: refused: {info.st_size} bytes, more than the {SMALL_FILE_LIMIT} "
                                            "a checkpoint's JSON file may hold")


def check_storage_ranges(path: str | Path, metadata) -> None:
    """Each stored range lies inside its file, and a byte item (read whole into memory) is small."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    byte_keys = {key for key, md in metadata.state_dict_metadata.items() if isinstance(md, BytesStorageMetadata)}
    sizes: dict[str, int] = {}
    for index, info in (metadata.storage_data or {}).items():
        file = Path(path) / info.relative_path
        if info.relative_path not in sizes:
            sizes[info.relative_path] = file.stat().st_size if file.is_file() else -1
        size = sizes[info.relative_path]
        if size < 0 or info.offset < 0 or info.length < 0 or info.offset + info.length > size:
            raise UnsafeCheckpointError(f"{path}/.metadata: refused: {index.fqn!r} is stored at bytes "
                                        f"{info.offset}..{info.offset + info.length} of {info.relative_path}, which "
                                        f"{'is missing' if size < 0 else f'holds {size}'}")
        if index.fqn in byte_keys and info.length > BYTE_ITEM_LIMIT:
            raise UnsafeCheckpointError(f"{file}: byte item {index.fqn!r}: refused: {info.length} bytes, more than "
                                        f"the {BYTE_ITEM_LIMIT} a byte item may hold")


# The DCP reader whose data is being read, so that a refused byte item can name its file.
_current_reader: contextvars.ContextVar = contextvars.ContextVar("mlmclm_dcp_reader", default=None)


def _limited(stream, source: str) -> bytes:
    try:
        return read_limited(stream, METADATA_LIMIT, source, "checkpoint index")
    except FileRefusedError as err:
        raise UnsafeCheckpointError(str(err)) from None


def _guarded_read_metadata(self, *args, **kwargs):
    path = self._get_metadata_path(kwargs.get("rank"))
    with self.fs.create_stream(path, "rb") as stream:
        metadata = read_metadata_bytes(_limited(stream, str(path)), str(path))
    if getattr(metadata, "storage_meta", None) is None:
        metadata.storage_meta = dcp_filesystem.StorageMeta()
    metadata.storage_meta.load_id = self.load_id
    return metadata


def _guarded_read_data(self, plan, planner):
    token = _current_reader.set(self)
    try:
        return _unguarded["read_data"](self, plan, planner)
    finally:
        _current_reader.reset(token)


def _item_source(item: ReadItem) -> str:
    reader = _current_reader.get()
    storage = getattr(reader, "storage_data", None) or {}
    info = storage.get(item.storage_index)
    where = f"{reader.path}/{info.relative_path}" if info is not None else "the checkpoint"
    return f"{where}: byte item {item.storage_index.fqn!r}"


def _guarded_load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
    from torch.distributed.checkpoint._traverse import set_element

    loaded = weights_only_load(value, _item_source(read_item))
    if self.flatten_state_dict:
        set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
    else:
        self.state_dict[read_item.dest_index.fqn] = loaded


_unguarded: dict = {}


def install() -> None:
    """Guard DCP's two unpickling readers for this process (idempotent). Every load path of ours calls it first."""
    if _unguarded:
        return
    _unguarded["read_metadata"] = dcp_filesystem.FileSystemReader.read_metadata
    _unguarded["read_data"] = dcp_filesystem.FileSystemReader.read_data
    _unguarded["load_bytes"] = DefaultLoadPlanner.load_bytes
    dcp_filesystem.FileSystemReader.read_metadata = _guarded_read_metadata
    dcp_filesystem.FileSystemReader.read_data = _guarded_read_data
    DefaultLoadPlanner.load_bytes = _guarded_load_bytes


class _ByteItemChecker:
    """The planner hook DCP's reader calls per byte item: read it with the weights-only loader, keep nothing."""

    def __init__(self, path: Path, files: dict):
        self.path, self.files = path, files

    def load_bytes(self, item: ReadItem, value) -> None:
        weights_only_load(value, f"{self.path}/{self.files[item.storage_index]}: byte item {item.storage_index.fqn!r}")


def check_byte_items(path: str | Path, metadata) -> None:
    """Read every byte item of the checkpoint at `path` with the weights-only loader (they are small)."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    from torch.distributed.checkpoint.planner import LoadPlan
    from torch.distributed.checkpoint.planner_helpers import _create_read_items

    reader = dcp_filesystem.FileSystemReader(str(path))
    reader.set_up_storage_reader(metadata, is_coordinator=True)
    items = [item for key, md in metadata.state_dict_metadata.items() if isinstance(md, BytesStorageMetadata)
             for item in _create_read_items(key, md, None)]
    checker = _ByteItemChecker(Path(path), {index: info.relative_path for index, info in metadata.storage_data.items()})
    _unguarded.get("read_data", dcp_filesystem.FileSystemReader.read_data)(reader, LoadPlan(items), checker).wait()


def check_checkpoint(path: str | Path):
    """Refuse a checkpoint directory whose `.metadata`, byte items or a legacy `common.pt` could run code, or whose
    files could block or exhaust a rank (FIFOs, devices, ranges past a file's end, huge byte items); return its
    DCP metadata. Called before megatron's loader so that a refusal is this error, not one wrapped by DCP's
    collectives (the guarded readers still stand behind it)."""
    refuse_legacy_common_file(path)
    refuse_special_files(path)
    metadata = read_metadata_file(path)
    check_storage_ranges(path, metadata)
    check_byte_items(path, metadata)
    return metadata


def refuse_legacy_common_file(path: str | Path) -> None:
    """megatron reads a legacy `common.pt` with torch.load; our checkpoints never have one (the common state is a DCP
    byte item), so a checkpoint that does is refused rather than trusted to torch.load's defaults."""
    legacy = Path(path) / "common.pt"
    if legacy.exists():
        raise UnsafeCheckpointError(f"{legacy}: refused: mlmclm checkpoints keep their common state inside the "
                                    f"torch_dist files; a separate common.pt was not written by mlmclm")
