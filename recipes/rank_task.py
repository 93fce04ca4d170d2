"""A recipe's training task as NeMo-Run runs it: a script whose ranks run `python -m recipes.rank` (not NeMo-Run's
`fdl_runner`, which imports all of NeMo-Run in every rank; recipes/rank.py says why)."""
from __future__ import annotations

import nemo_run as run

from mlmclm.train.config import TrainConfig
from recipes.base import validate
from recipes.entry import pretrain_entry
from recipes.rank import END_OF_TASK, encode_task


def is_training(task) -> bool:
    return isinstance(task, run.Partial) and task.__fn_or_cls__ is pretrain_entry


def rank_script(partial: run.Partial) -> run.Script:
    """The training `partial` as an inline script (NeMo-Run writes it to the task's scripts/ folder; torchrun
    starts it in every rank). The config is the one the launch validated, built; a config that would not come
    back the same from its JSON is refused here rather than trained differently."""
    config = validate(partial)
    data = config.to_dict()
    if TrainConfig.from_dict(data).to_dict() != data:
        raise ValueError("the run's config does not survive its JSON round trip; not launched")
    encoded = encode_task(data, partial.nodes, partial.gpus_per_node)
    return run.Script(inline=f"exec python -m recipes.rank <<'{END_OF_TASK}'\n{encoded}{END_OF_TASK}\n")


def as_launched(task):
    """What the experiment is given for `task`: a training Partial's script; any other task unchanged."""
    return rank_script(task) if is_training(task) else task
