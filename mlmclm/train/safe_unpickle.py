"""Unpickling that cannot run a checkpoint author's code: an allow-list unpickler (`find_class` refuses every global
outside the list before importing it) and torch's weights-only loader, each refusal an `UnsafeCheckpointError`
naming the file and the import. Used by the checkpoint guard (mlmclm.train.checkpoint_guard) for DCP's `.metadata`
and byte items, and by mlmclm.train.te_extra_state for Transformer Engine's FP8 metadata."""
from __future__ import annotations

import io
import pickle
import warnings

import torch

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

STORAGE_FROM_BYTES = frozenset({("torch.storage", "_load_from_bytes"),
                                 ("megatron.core.safe_globals", "safe_load_from_bytes")})


class UnsafeCheckpointError(RuntimeError):
    """A checkpoint file that would run code (or import something no checkpoint needs) if it were unpickled."""


def _is_dtype(module: str, name: str) -> bool:
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


class AllowListUnpickler(pickle.Unpickler):
    """Unpickles only objects built from `allowed` globals; anything else is refused before it is imported."""

    def __init__(self, data: bytes, source: str, allowed: frozenset):
        super().__init__(io.BytesIO(data))
        self.source = source
        self.allowed = allowed

    def find_class(self, module: str, name: str):
        if (module, name) in STORAGE_FROM_BYTES and (module, name) in self.allowed:
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
        with warnings.catch_warnings():
            # torch's hint that a protocol other than its own 2 "might not" load: it loads, or it is refused below
            # with the imports named; the hint alone, printed before the refusal, read as the cause (checkpoint_guard)
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
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
    return AllowListUnpickler(data, source, METADATA_GLOBALS).load()
