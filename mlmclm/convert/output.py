"""Atomic output directories and streaming safetensors shards."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import torch

from mlmclm.atomic_write import dir_mode


class OutputExistsError(FileExistsError):
    pass


def check_output(output: Path, force: bool) -> None:
    """Refuse an existing output (unless `force`) before any work starts."""
    if output.exists() and not force:
        raise OutputExistsError(f"{output} already exists; pass --force (force=True) to replace it")
    if output.exists() and not output.is_dir():
        raise OutputExistsError(f"{output} exists and is not a directory")


@contextlib.contextmanager
def staged_output(output: Path, force: bool) -> Iterator[Path]:
    """Yield a temporary sibling directory; on success it replaces `output` by a rename, on error it is removed.

    The output is untouched until everything was written: a failure, Ctrl-C or bad input leaves it as it was.
    """
    output = Path(output).absolute()
    check_output(output, force)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    try:
        yield staging
        check_output(output, force)  # someone may have created it meanwhile
        if output.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old-", dir=output.parent))
            os.replace(output, old / output.name)
            os.replace(staging, output)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, output)
        os.chmod(output, dir_mode())  # mkdtemp makes 0700; give what mkdir would under the user's umask
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


_SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}


class SafetensorsStreamWriter:
    """Write tensors straight to safetensors files as they arrive, one tensor in memory at a time.

    The safetensors header lists every tensor's offsets before the data, so the writer takes the plan (names,
    shapes, dtype, in order) up front, e.g. from the mapping run on meta tensors. One shard →
    `model.safetensors`; several → `model-0000i-of-0000n.safetensors` plus `model.safetensors.index.json`.
    """

    def __init__(self, directory: Path, plan: list[tuple[str, tuple[int, ...]]], dtype: torch.dtype,
                 max_shard_bytes: int, metadata: dict | None = None):
        self.directory, self.dtype = Path(directory), dtype
        itemsize = torch.empty((), dtype=dtype).element_size()
        shards: list[list[tuple[str, tuple[int, ...], int]]] = [[]]
        used = 0
        for name, shape in plan:
            size = itemsize * int(torch.Size(shape).numel())
            if shards[-1] and used + size > max_shard_bytes:
                shards.append([])
                used = 0
            shards[-1].append((name, tuple(shape), size))
            used += size
        count = len(shards)
        self.files = (["model.safetensors"] if count == 1 else
                      [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)])
        self._queue = [(self.files[i], entries) for i, entries in enumerate(shards)]
        self._metadata = {"format": "pt", **(metadata or {})}
        self._expected: list[tuple[str, tuple[int, ...]]] = []
        self._handle = None
        self.total_bytes = sum(size for entries in shards for _, _, size in entries)
        self.num_params = sum(int(torch.Size(shape).numel()) for _, shape in plan)

    def _open_next(self) -> None:
        filename, entries = self._queue.pop(0)
        header, offset = {"__metadata__": self._metadata}, 0
        for name, shape, size in entries:
            header[name] = {"dtype": _SAFETENSORS_DTYPES[self.dtype], "shape": list(shape),
                            "data_offsets": [offset, offset + size]}
            offset += size
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned
        self._handle = open(self.directory / filename, "wb")
        self._handle.write(len(raw).to_bytes(8, "little") + raw)
        self._expected = [(name, shape) for name, shape, _ in entries]

    def write(self, name: str, tensor: torch.Tensor) -> None:
        if not self._expected:
            if self._handle:
                self._handle.close()
            if not self._queue:
                raise ValueError(f"tensor {name!r} was not in the plan")
            self._open_next()
        want_name, want_shape = self._expected.pop(0)
        if (name, tuple(tensor.shape)) != (want_name, want_shape):
            raise ValueError(f"expected {want_name} {want_shape}, got {name} {tuple(tensor.shape)}")
        data = tensor.to(self.dtype).contiguous().reshape(-1).view(torch.uint8)
        self._handle.write(memoryview(data.numpy()))

    def close(self) -> list[str]:
        if self._handle:
            self._handle.close()
        if self._expected or self._queue:
            raise ValueError(f"{len(self._expected) + sum(len(e) for _, e in self._queue)} planned tensors were "
                             f"never written")
        if len(self.files) > 1:
            weight_map = {}
            for filename in self.files:
                from safetensors import safe_open

                with safe_open(str(self.directory / filename), framework="pt") as f:
                    weight_map.update({key: filename for key in f.keys()})
            index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
            (self.directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2,
                                                                                    sort_keys=True))
        return list(self.files)
