"""What each torchrun process of a training task runs: `python -m recipes.rank`, its task on standard input.

A recipe is a `run.Partial(pretrain_entry, config=..., nodes=..., gpus_per_node=...)`. NeMo-Run would run it in
every rank through its own `fdl_runner`, which imports all of NeMo-Run (its Lepton and cloud executors, pydantic,
fastapi, libcst) — 3.3 CPU-seconds more per rank than this module, measured on a 2-core Xeon
(`python benchmarks/rank_startup.py --rounds 3 --processes 2`: medians 26.3 against 19.7 CPU-s a launch) — and
deserialises a fiddle config that names the modules to import. The launch gives each rank the built TrainConfig
as JSON instead (`recipes.rank_task`): this module imports the trainer and nothing of NeMo-Run, and the JSON names
no code.

The task travels base64-encoded in the task's script (a here-document), so no shell and no path substitution of
NeMo-Run's touches it: its bare-metal Slurm launch rewrites every `/nemo_run` in an inline script, which a
path in the config could hold; base64's alphabet has no `_`, so the encoded text cannot.
"""
from __future__ import annotations

import base64
import binascii
import json
import sys

# The heredoc's end marker in the task's script (not a base64 word: it holds `_`).
END_OF_TASK = "MLMCLM_TASK_END"
# A TrainConfig is a few kilobytes; more on the standard input is not a task of ours.
MAX_TASK_BYTES = 1 << 20


class TaskDecodeError(ValueError):
    """The text handed to a rank is not a task `encode_task` wrote."""


def encode_task(config: dict, nodes: int, gpus_per_node: int) -> str:
    """The task (a TrainConfig's dict and the world it was sized for) as base64 lines of 76 characters."""
    payload = json.dumps({"config": config, "nodes": nodes, "gpus_per_node": gpus_per_node}, sort_keys=True,
                         allow_nan=False)
    return base64.encodebytes(payload.encode("utf-8")).decode("ascii")


def decode_task(text: str) -> tuple[dict, int, int]:
    """(config dict, nodes, gpus_per_node) of `encode_task`'s text; TaskDecodeError naming what is wrong."""
    try:
        payload = json.loads(base64.b64decode("".join(text.split()), validate=True).decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError) as err:
        raise TaskDecodeError(f"the task on standard input is not base64 of a JSON task: {err}") from None
    if not isinstance(payload, dict) or set(payload) != {"config", "nodes", "gpus_per_node"}:
        raise TaskDecodeError("the task on standard input is not a training task (config, nodes, gpus_per_node)")
    if not isinstance(payload["config"], dict) or not all(
            isinstance(payload[k], int) and payload[k] >= 1 for k in ("nodes", "gpus_per_node")):
        raise TaskDecodeError("the task's config must be a mapping and its nodes, gpus_per_node positive integers")
    return payload["config"], payload["nodes"], payload["gpus_per_node"]


def task_of_script(text: str) -> tuple[dict, int, int]:
    """The task inside a task script `recipes.rank_task` wrote (its heredoc's lines)."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.endswith(f"<<'{END_OF_TASK}'")) + 1
        end = lines.index(END_OF_TASK, start)
    except (StopIteration, ValueError):
        raise TaskDecodeError(f"no task between <<'{END_OF_TASK}' and {END_OF_TASK} in the script") from None
    return decode_task("\n".join(lines[start:end]))


def main() -> None:
    text = sys.stdin.buffer.read(MAX_TASK_BYTES + 1)
    if len(text) > MAX_TASK_BYTES:
        raise SystemExit(f"error: more than {MAX_TASK_BYTES} bytes on standard input: not a task of recipes.rank")
    try:
        config, nodes, gpus_per_node = decode_task(text.decode("ascii", errors="replace"))
    except TaskDecodeError as err:
        raise SystemExit(f"error: {err}") from None
    from mlmclm.train.config import TrainConfig
    from recipes.entry import pretrain_entry

    pretrain_entry(TrainConfig.from_dict(config), nodes=nodes, gpus_per_node=gpus_per_node)


if __name__ == "__main__":
    main()
