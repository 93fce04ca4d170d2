"""Copies of a real checkpoint with a payload that creates a file when unpickled, as an attacker would plant it.

Two places a torch_dist checkpoint is unpickled from: its `.metadata` (here the payload rides along as an extra
attribute of an otherwise intact `Metadata`, so an unguarded load even succeeds) and a byte item (here the common
state, read on every load, re-pointed at a payload appended to a data file).
"""
import os
import pickle
import shutil
from pathlib import Path

from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from mlmclm.train.checkpoint_guard import read_metadata_file


class CreatesFile:
    """Unpickling this runs `touch marker` (os.system: the classic payload)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def copy_checkpoint(iteration_dir: Path, run_dir: Path) -> Path:
    """A run directory holding a copy of `iteration_dir` as its latest checkpoint."""
    target = run_dir / "checkpoints" / iteration_dir.name
    shutil.copytree(iteration_dir, target)
    (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").write_text(iteration_dir.name.split("_")[1])
    return target


def plant_in_metadata(iteration_dir: Path, marker: Path) -> None:
    metadata = read_metadata_file(iteration_dir)
    metadata.__dict__["note"] = CreatesFile(marker)
    (iteration_dir / ".metadata").write_bytes(pickle.dumps(metadata))


def plant_in_byte_item(iteration_dir: Path, marker: Path, key_part: str = "common_state") -> str:
    """Point the first byte item whose key contains `key_part` at a payload; returns the data file's name."""
    metadata = read_metadata_file(iteration_dir)
    key = next(k for k, md in metadata.state_dict_metadata.items()
               if isinstance(md, BytesStorageMetadata) and key_part in k)
    index = next(i for i in metadata.storage_data if i.fqn == key)
    info = metadata.storage_data[index]
    data_file = iteration_dir / info.relative_path
    payload = pickle.dumps(CreatesFile(marker))
    offset = data_file.stat().st_size
    with data_file.open("ab") as out:
        out.write(payload)
    metadata.storage_data[index] = _StorageInfo(info.relative_path, offset, len(payload),
                                                info.transform_descriptors)
    (iteration_dir / ".metadata").write_bytes(pickle.dumps(metadata))
    return info.relative_path
