"""Read model tensors from a megatron torch_dist checkpoint one at a time, without a process group.

megatron saves each transformer weight under one *stacked* key (e.g. `decoder.layers.mlp.linear_fc1.weight`,
shape [num_layers, ...]) whose saved chunks are (layer, TP slice) pieces, whatever the TP/PP/VPP/DP layout was.
Asking for one layer reads only that layer's chunks: memory stays at one full tensor, not the model.
"""
from __future__ import annotations

import re
from pathlib import Path

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from mlmclm.model.hf_mapping import to_te_name
from mlmclm.train import checkpoint_guard
from mlmclm.train.checkpoint_guard import UnsafeCheckpointError

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


class CheckpointReadError(RuntimeError):
    pass


class _IntoBuffer:
    """The two planner hooks FileSystemReader.read_data calls: where each read chunk goes."""

    def __init__(self, target: torch.Tensor):
        self.target = target

    def resolve_tensor(self, item: ReadItem) -> torch.Tensor:
        view = self.target
        for dim, (start, length) in enumerate(zip(item.dest_offsets, item.lengths)):
            view = view.narrow(dim, start, length)
        return view

    def commit_tensor(self, item: ReadItem, tensor: torch.Tensor) -> None:
        pass

    def load_bytes(self, item: ReadItem, value) -> None:  # model tensors only: never asked for bytes
        raise CheckpointReadError(f"unexpected bytes item {item.storage_index.fqn}")


class DistCheckpointReader:
    """Full tensors by *full-model* megatron name (`decoder.layers.3.mlp.linear_fc1.weight`) from a torch_dist dir."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not (self.path / ".metadata").exists():
            raise CheckpointReadError(f"{self.path} has no .metadata: not a torch_dist checkpoint (or torn)")
        checkpoint_guard.install()
        self._reader = FileSystemReader(str(self.path))
        try:
            self._metadata = checkpoint_guard.read_metadata_file(self.path)
        except UnsafeCheckpointError:
            raise
        except Exception as err:  # a truncated/garbled .metadata
            raise CheckpointReadError(f"{self.path}/.metadata is unreadable: {type(err).__name__}: {err}") from err
        self._reader.set_up_storage_reader(self._metadata, is_coordinator=True)
        for relative in {info.relative_path for info in self._metadata.storage_data.values()}:
            if not (self.path / relative).exists():
                raise CheckpointReadError(f"{self.path} is missing its data file {relative} (torn checkpoint)")
        # Conversion reads no byte item, but a checkpoint holding a hostile one is refused here as everywhere else.
        checkpoint_guard.refuse_legacy_common_file(self.path)
        try:
            checkpoint_guard.check_byte_items(self.path, self._metadata)
        except UnsafeCheckpointError:
            raise
        except Exception as err:  # truncated or garbled data file
            raise CheckpointReadError(f"{self.path}: cannot read its byte items: {type(err).__name__}: {err} "
                                      f"(torn or corrupted checkpoint)") from err

    def _tensor_md(self, key: str) -> TensorStorageMetadata:
        md = self._metadata.state_dict_metadata.get(key)
        if not isinstance(md, TensorStorageMetadata):
            raise CheckpointReadError(f"{self.path}: no tensor {key!r} in the checkpoint")
        return md

    def _locate(self, name: str) -> tuple[str, int | None]:
        """(saved key, layer index or None) for a full-model megatron name."""
        match = _LAYER.match(to_te_name(name))
        if match:
            return f"decoder.layers.{match.group(2)}", int(match.group(1))
        return name, None

    def saved_layers(self) -> int:
        """How many transformer layers the stacked keys hold."""
        return int(self._tensor_md("decoder.layers.self_attention.linear_qkv.weight").size[0])

    def shape(self, name: str) -> tuple[int, ...]:
        key, layer = self._locate(name)
        size = tuple(self._tensor_md(key).size)
        return size[1:] if layer is not None else size

    def dtype(self, name: str) -> torch.dtype:
        return self._tensor_md(self._locate(name)[0]).properties.dtype

    def read(self, name: str) -> torch.Tensor:
        key, layer = self._locate(name)
        md = self._tensor_md(key)
        size = list(md.size)
        offsets = [0] * len(size)
        if layer is not None:
            if not 0 <= layer < size[0]:
                raise CheckpointReadError(f"{self.path}: {key} holds {size[0]} layers, layer {layer} requested")
            offsets[0], size[0] = layer, 1
        wanted = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(size))
        items = create_read_items_for_chunk_list(key, md, [wanted])
        covered = sum(item.lengths.numel() for item in items)
        if covered != torch.Size(size).numel():
            raise CheckpointReadError(f"{self.path}: saved chunks of {key} cover {covered} of "
                                      f"{torch.Size(size).numel()} elements (torn or partial checkpoint)")
        target = torch.empty(size, dtype=md.properties.dtype)
        try:
            self._reader.read_data(LoadPlan(items), _IntoBuffer(target)).wait()
        except Exception as err:  # truncated or garbled data file
            raise CheckpointReadError(f"{self.path}: cannot read {name} ({key}): {type(err).__name__}: {err} "
                                      f"(torn or corrupted checkpoint)") from err
        return target[0] if layer is not None else target
