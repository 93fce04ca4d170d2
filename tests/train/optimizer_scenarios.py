"""Worker for the resume tests under Transformer Engine's optimizer (its CPU stand-in) and torch's AdamW.

Each spawned process group runs one `pretrain` under the optimizer its `Run` names (one run per process, as a
relaunch after preemption is: a second pretrain in the same processes could hang in the next process-group set-up
after a run failed). A run can be stopped after a chosen step by SIGUSR1 to rank 0 — the preemption path itself:
the signal is agreed at the step's read, the run saves and returns "preempted". Every step also draws from
Python's `random` and numpy's global generator, as a feature using them would: a resume continues those streams
only if the checkpoint restored them. Records are plain JSON (rank 0).
"""
import json
import os
import random
import signal
from dataclasses import dataclass

import numpy as np


@dataclass
class Run:
    cfg: dict
    optimizer: str = "te"  # "te": the FusedAdam stand-in, switched in as megatron would pick TE's; "torch": AdamW
    stop_after: int | None = None  # SIGUSR1 to rank 0 during this step (global step number)


def run_one(run: Run, record_path) -> None:
    import contextlib
    import warnings

    warnings.filterwarnings("ignore")
    from fused_adam_standin import fused_adam_standin
    from mlmclm.train import pretrain as pt
    from mlmclm.train.config import TrainConfig

    rank0 = os.environ.get("RANK") == "0"
    record: dict = {"draws": {}}
    original_restore, original_step = pt._Run._restore, pt.train_step

    def restore(self):
        original_restore(self)
        record["iteration"] = self.iteration
        record["after_restore"] = _optimizer_state(self.optimizer)

    def train_step(ddp, optimizer, *args, **kwargs):
        record["iteration"] += 1
        if rank0 and record["iteration"] == run.stop_after:
            os.kill(os.getpid(), signal.SIGUSR1)
        record["draws"][record["iteration"]] = [random.random(), float(np.random.rand())]
        result = original_step(ddp, optimizer, *args, **kwargs)
        record["at_end"] = _optimizer_state(optimizer)
        return result

    pt._Run._restore, pt.train_step = restore, train_step
    try:
        with fused_adam_standin() if run.optimizer == "te" else contextlib.nullcontext():
            result = pt.pretrain(TrainConfig.from_dict(run.cfg))
        record.update(status=result.status, steps=result.steps, error=None)
    except Exception as err:  # the test asserts on it
        record.update(status="failed", error=f"{type(err).__name__}: {err}")
    if rank0:
        with open(record_path, "w") as handle:
            json.dump(record, handle)


def _optimizer_state(optimizer) -> dict:
    """Where each inner optimizer keeps its Adam step (group or per parameter) and which per-parameter entries."""
    inner = [part.optimizer for part in getattr(optimizer, "chained_optimizers", [optimizer])]
    group_steps = sorted({repr(g["step"]) for opt in inner for g in opt.param_groups if "step" in g})
    names = sorted({name for opt in inner for entries in opt.state.values() for name in entries})
    return {"optimizer": sorted({type(opt).__name__ for opt in inner}), "group_steps": group_steps,
            "param_state_names": names}
