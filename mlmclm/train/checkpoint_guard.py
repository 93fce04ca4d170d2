"""Reading a checkpoint never runs code stored in it.

megatron's `torch_dist` format is PyTorch Distributed Checkpoint, and three readers in that stack unpickle what a
checkpoint's author wrote: DCP's `FileSystemReader.read_metadata` (`pickle.load` of `.metadata`), DCP's
`DefaultLoadPlanner.load_bytes` (`torch.load(weights_only=False)` of every non-tensor item; megatron's planner
inherits it), and Transformer Engine's `set_extra_state` (`pickle.loads` of each module's FP8 metadata). A pickle can
import and call anything, so each of these would run a hostile checkpoint's code before any check of ours.

`install()` replaces the first two, process-wide, with readers that cannot execute code:
- `.metadata` is unpickled with `find_class` limited to the DCP metadata classes, torch dtypes and `torch.Size`
  (`METADATA_GLOBALS`). A pickle runs code only through a global it imports, so a hostile one is refused at its first
  other import, before any of its code has run; the error names the file and the import.
- byte items are read with torch's weights-only unpickler (its own allow-list: containers, numbers, strings, tensors).
`safe_extra_state` decodes a TE extra state the same way — a tensor of any dtype, as TE and megatron read any — and
hands TE a re-serialised copy of what it decoded, so TE's own `pickle.loads` only ever sees bytes we wrote. TE >= 2.18 refuses any delayed-scaling payload in
`set_extra_state` unless NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1 (`transformer_engine/pytorch/_extra_state.py`), so
`load_vetted_state` sets that variable for the one `load_state_dict` call that hands TE those copies — only when
every non-empty extra state in it is one `safe_extra_state` produced, and restored right after.

Not covered: anything outside these readers (a tokenizer's files are read by `transformers`, which runs no remote
code unless asked; `safetensors` files hold no code). Paths inside `.metadata` are taken as written: a hostile one can
make DCP read another file as tensor data (read with `weights_only=True`, so it cannot run code either).
"""
from __future__ import annotations

import contextlib
import contextvars
import io
import os
import pickle
from pathlib import Path

import torch
from torch.distributed.checkpoint import filesystem as dcp_filesystem
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import ReadItem

from mlmclm.bounded_read import FileRefusedError, SMALL_FILE_LIMIT, check_regular_file, read_limited, read_regular_file

# Every global the `.metadata` of a torch_dist checkpoint legitimately imports (torch 2.x DCP, megatron-core 0.19),
# besides torch's dtypes. Found by recording `find_class` while reading our checkpoints at every layout.
METADATA_GLOBALS = frozenset({
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("torch.distributed.checkpoint.metadata", "Metadata"),
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
    ("torch.distributed.checkpoint.metadata", "StorageMeta"),
    ("torch.distributed.checkpoint.metadata", "TensorProperties"),
    ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.planner", "SavePlan"),
    ("torch.distributed.checkpoint.planner", "WriteItem"),
    ("torch.distributed.checkpoint.planner", "WriteItemType"),
    ("torch.distributed.checkpoint.planner", "TensorWriteData"),
    ("torch.distributed.checkpoint.planner", "BytesIOWriteData"),
})

# A TE extra state is a plain pickle (TE's `get_extra_state`) of a dict of CPU tensors, numbers and, in TE 2.x, the FP8
# recipe. Plain pickle stores a tensor as `_rebuild_tensor_v2` over a storage that `_load_from_bytes` reads with
# torch.load (megatron swaps in its weights-only `safe_load_from_bytes` at import; both are routed to ours). The recipe
# classes are the ones megatron-core 0.19's own extra-state unpickler (`megatron.core.safe_globals`) accepts.
_TE_RECIPE = "transformer_engine.common.recipe"
_EXTRA_STATE_GLOBALS = frozenset({
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._tensor", "_rebuild_from_type_v2"),
    ("torch.storage", "UntypedStorage"),
    ("torch", "Size"),
    ("collections", "OrderedDict"),
    *((_TE_RECIPE, name) for name in ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling",
                                      "MXFP8BlockScaling", "NVFP4BlockScaling", "Format", "_FormatHelper",
                                      "MMParams", "QParams")),
    ("megatron.core.extensions.transformer_engine", "TEDelayedScaling"),
    *(("builtins", name) for name in ("dict", "list", "tuple", "int", "float", "bool", "bytes", "str")),
})
_STORAGE_FROM_BYTES = frozenset({("torch.storage", "_load_from_bytes"),
                                 ("megatron.core.safe_globals", "safe_load_from_bytes")})


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file that would run code (or import something no checkpoint needs) if it were unpickled."""


def _is_dtype(module: str, name: str) -> bool:
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


class _AllowListUnpickler(pickle.Unpickler):
    """Unpickles only objects built from `allowed` globals; anything else is refused before it is imported."""

    def __init__(self, data: bytes, source: str, allowed: frozenset):
        super().__init__(io.BytesIO(data))
        self.source = source
        self.allowed = allowed

    def find_class(self, module: str, name: str):
        if (module, name) in _STORAGE_FROM_BYTES and (module, name) in self.allowed:
            return self._storage_from_bytes
        if (module, name) in self.allowed or _is_dtype(module, name):
            return super().find_class(module, name)
        raise UnsafeCheckpointError(
            f"{self.source}: refused: its pickle imports {module}.{name}, which no checkpoint needs (unpickling it "
            f"could run code). This file was not written by mlmclm/megatron or has been tampered with.")

    def persistent_load(self, pid):
        raise UnsafeCheckpointError(f"{self.source}: refused: its pickle asks for a persistent object ({pid!r})")

    def _storage_from_bytes(self, data: bytes):
        return weights_only_load(io.BytesIO(data), f"{self.source} (a tensor inside it)")


def weights_only_load(stream, source: str):
    """torch.load with the weights-only unpickler; a refusal becomes an UnsafeCheckpointError naming `source` and the
    imports the pickle asks for."""
    data = stream.getvalue() if isinstance(stream, io.BytesIO) else None
    try:
        return torch.load(stream, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        imports = ", ".join(pickle_imports(data)) if data is not None else ""
        reason = f"it imports {imports}" if imports else next(
            (line.strip() for line in str(err).splitlines() if "global" in line.lower()), str(err).splitlines()[0])
        raise UnsafeCheckpointError(f"{source}: refused by the weights-only loader: {reason}") from None


def pickle_imports(data: bytes) -> list[str]:
    """The globals a pickle (or a torch.save zip's data.pkl) imports, read from its opcodes without unpickling: for
    error messages. STACK_GLOBAL takes its names from the two strings pushed (or fetched from the memo) before it."""
    import pickletools
    import zipfile

    if data[:2] == b"PK":
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    found, strings, memo, last = [], [], {}, None
    try:
        for opcode, arg, _ in pickletools.genops(data):
            pushed = None
            if opcode.name == "GLOBAL":
                found.append(arg.replace(" ", "."))
            elif opcode.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(f"{strings[-2]}.{strings[-1]}")
            elif isinstance(arg, str) and "UNICODE" in opcode.name:
                pushed = arg
            elif opcode.name in ("BINPUT", "LONG_BINPUT", "PUT", "MEMOIZE"):
                memo[len(memo) if arg is None else arg] = last
                continue  # memoizing leaves the top of the stack as it was
            elif opcode.name in ("BINGET", "LONG_BINGET", "GET"):
                pushed = memo.get(arg)
            if pushed is not None:
                strings.append(pushed)
            last = pushed
    except Exception:  # a truncated or garbled pickle: report what was read before the damage
        pass
    return found


def read_metadata_bytes(data: bytes, source: str):
    return _AllowListUnpickler(data, source, METADATA_GLOBALS).load()


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


def safe_extra_state(value, source: str):
    """A TE `_extra_state` value that TE's own loader can unpickle without running stored code.

    TE's `set_extra_state` (2.x) and megatron's `_decode_extra_state` unpickle `state.numpy().tobytes()` of a tensor
    of *any* dtype, so every non-empty tensor is vetted whatever its dtype: its bytes, read as they do, are decoded
    with the allow-list and re-pickled from what was decoded into the uint8 tensor TE writes. BytesIO (older TE) is
    read and re-saved with torch's weights-only loader. A payload that does not decode is refused, not passed on: TE
    would `pickle.loads` it unvetted, and its reader need not fail where ours did (a storage ours could not read
    weights-only is one TE's `torch.load` reads in full). Any other type is refused (TE and megatron know none). The
    one exception: an allow-listed class that cannot be imported here, where any reader fails at the same import;
    the payload goes on as it is.
    """
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.numel() == 0:
            return value  # megatron's local layers and TE without FP8: nothing is unpickled
        data = _bytes_as_te_reads_them(value, source)
        try:
            decoded = _AllowListUnpickler(data, source, _EXTRA_STATE_GLOBALS | _STORAGE_FROM_BYTES).load()
        except UnsafeCheckpointError:
            raise
        except (ImportError, AttributeError):
            # An allow-listed class this install lacks (TE's recipe without TE: a TE run exported on CPU). TE's own
            # unpickler, if TE is here at all, stops at the same import, having run only what ours vetted before it.
            return value
        except Exception as err:
            raise UnsafeCheckpointError(f"{source}: refused: this Transformer Engine extra state does not decode as "
                                        f"the FP8 metadata TE writes ({type(err).__name__}: {err}); it is truncated, "
                                        "corrupt or not TE's") from None
        return _vetted(torch.frombuffer(bytearray(pickle.dumps(decoded)), dtype=torch.uint8))
    if isinstance(value, io.BytesIO):
        value.seek(0)
        decoded = weights_only_load(value, source)
        fresh = io.BytesIO()
        torch.save(decoded, fresh)
        fresh.seek(0)
        return _vetted(fresh)
    raise UnsafeCheckpointError(f"{source}: refused: a Transformer Engine extra state is a byte tensor or a BytesIO; "
                                f"this one is {type(value).__name__}, which no TE or megatron version writes")


def _bytes_as_te_reads_them(value: torch.Tensor, source: str) -> bytes:
    """`value.detach().cpu().numpy().tobytes()`, TE's and megatron's reading; a dtype numpy cannot hold (bf16, FP8)
    makes their reader fail before any unpickling, and is refused here with that reason."""
    try:
        return value.detach().cpu().numpy().tobytes()
    except (TypeError, RuntimeError) as err:
        raise UnsafeCheckpointError(f"{source}: refused: this Transformer Engine extra state is a {value.dtype} "
                                    f"tensor, which TE's reader cannot turn into bytes ({err})") from None


# The extra states `safe_extra_state` wrote (by identity, held until `load_vetted_state` hands them over).
_VETTED: dict[int, object] = {}
UNSAFE_PICKLE_EXTRA_STATE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"  # TE >= 2.18's opt-in, read per call


def _vetted(value):
    _VETTED[id(value)] = value
    return value


def _carries_a_pickle(value) -> bool:
    """What TE's `set_extra_state` would unpickle: a non-empty byte tensor, or a BytesIO."""
    return isinstance(value, io.BytesIO) or (isinstance(value, torch.Tensor) and value.numel() > 0)


@contextlib.contextmanager
def _te_pickle_opt_in():
    before = os.environ.get(UNSAFE_PICKLE_EXTRA_STATE_ENV)
    os.environ[UNSAFE_PICKLE_EXTRA_STATE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[UNSAFE_PICKLE_EXTRA_STATE_ENV]
        else:
            os.environ[UNSAFE_PICKLE_EXTRA_STATE_ENV] = before


def load_vetted_state(module: torch.nn.Module, state: dict):
    """`module.load_state_dict(state, strict=False)`, with TE's pickle opt-in set for exactly this call when every
    extra state TE would unpickle is a copy `safe_extra_state` wrote (then TE unpickles only our bytes). If any is
    not, the opt-in stays as it was and TE's own refusal applies to it. Synchronous, on the loading thread: no
    other reader of the variable runs meanwhile (checkpoint saves are synchronous too)."""
    pickles = [v for k, v in state.items() if k.endswith("_extra_state") and _carries_a_pickle(v)]
    all_vetted = all(id(v) in _VETTED and _VETTED[id(v)] is v for v in pickles)
    try:
        if pickles and all_vetted:
            with _te_pickle_opt_in():
                return module.load_state_dict(state, strict=False)
        return module.load_state_dict(state, strict=False)
    finally:
        for value in pickles:
            _VETTED.pop(id(value), None)


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
