"""A run's checkpoint folder as files: where each iteration lives, which is complete, which is the latest, and its
small JSON files read with bounds (mlmclm.train.checkpoint writes and loads the checkpoints themselves on
megatron-core). No torch or megatron-core here: the launcher, the sweep's plan and the refusal messages read
checkpoints' state without them."""
from __future__ import annotations

from pathlib import Path

from mlmclm.bounded_read import FileRefusedError, read_regular_json, read_regular_text


class CheckpointError(RuntimeError):
    pass


LATEST_FILE = "latest_checkpointed_iteration.txt"
RUN_CONFIG = "run_config.json"
TRAIN_STATE = "train_state.json"


def iteration_dir(root: Path, iteration: int) -> Path:
    return Path(root) / f"iter_{iteration:07d}"


def is_complete(path: Path) -> bool:
    return (path / "metadata.json").exists() and (path / RUN_CONFIG).exists() and (path / TRAIN_STATE).exists()


def latest_checkpoint(root: Path) -> Path | None:
    """The latest complete checkpoint under `root`, or None if there is none."""
    pointer = Path(root) / LATEST_FILE
    if not pointer.exists():
        return None
    try:
        text = read_regular_text(pointer, limit=64, what="checkpoint pointer").strip()
    except (FileRefusedError, UnicodeDecodeError) as err:
        raise CheckpointError(str(err) if isinstance(err, FileRefusedError) else f"{pointer}: not text: {err}") from None
    if not text.isdigit():
        raise CheckpointError(f"{pointer} does not hold an iteration number: {text!r}")
    path = iteration_dir(root, int(text))
    if not is_complete(path):
        raise CheckpointError(f"{pointer} names {path.name}, which is missing or incomplete")
    return path


def resolve_checkpoint(path: str | Path) -> Path:
    """A run directory, a checkpoints directory, or an `iter_*` directory → a complete iteration directory."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint path {path} does not exist")
    if path.name.startswith("iter_"):
        if not is_complete(path):
            raise CheckpointError(
                f"{path} is not a complete checkpoint (needs metadata.json, {RUN_CONFIG} and {TRAIN_STATE})")
        return path
    for root in (path, path / "checkpoints"):
        if (root / LATEST_FILE).exists():
            return latest_checkpoint(root)
    raise CheckpointError(f"{path} holds no checkpoint (no {LATEST_FILE} and not an iter_* directory)")


def read_json(path: Path, name: str) -> dict:
    file = Path(path) / name
    if not file.exists():
        raise CheckpointError(f"{file} is missing")
    try:  # a checkpoint may be someone else's (init_from, a branch source): a FIFO or /dev/zero is refused, not read
        value = read_regular_json(file, what="checkpoint file")
    except FileRefusedError as err:
        raise CheckpointError(str(err)) from None
    except ValueError as err:
        raise CheckpointError(f"{file}: not valid JSON: {err}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{file}: expected a JSON object, found {type(value).__name__}")
    return value


def last_complete(root: Path) -> Path | None:
    try:
        return latest_checkpoint(root)
    except CheckpointError:
        return None
