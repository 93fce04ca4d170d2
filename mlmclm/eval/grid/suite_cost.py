"""`grid --list`'s price of the paper suite per model: device-hours from the model's FLOPs (cost.py, the FLOPs
function `recipes.sweep --plan` prices pretraining with) at a stated MFU and peak, and the wall time on K GPUs
(longest units first onto the least loaded GPU, as the workers take them).

The fine-tuning FLOPs need each task's rows per step (the batch) and tokens per row. Tokens per row are not
counted here (no data is read): ASSUMED_TOKENS are estimates of the mean training row under a ~128k-entry BPE,
stated with the figure. An epoch budget needs the training rows: the manifest's when `--data-root` is given, else
the sets' published sizes (ASSUMED_TRAIN_ROWS). Evaluation passes (forward only) are not counted.
"""
from __future__ import annotations

import math

from mlmclm.eval.finetune.presets import PAPER_TASKS
from mlmclm.eval.finetune.protocol import ProtocolConfig
from mlmclm.eval.finetune.suite_plan import task_budget
from mlmclm.eval.grid.cost import (DEFAULT_MFU, DEFAULT_PEAK, EncoderShape, device_hours, hours_text, training_flops,
                                   wall_hours)

# Mean tokens of one training row (MNLI/QQP: the pair in its template; QA: question + context; MS MARCO: a query and
# its passage, both towers): estimates, not counts.
ASSUMED_TOKENS = {"sst2": 13, "mnli": 50, "qqp": 35, "conll2003": 20, "ontonotes5": 25, "uner_en": 22,
                  "squad": 180, "squad_v2": 180, "qed": 250, "record": 300, "msmarco": 85}
# Training rows of the epoch-budget tasks (the sets' published train sizes; QED: its train split).
ASSUMED_TRAIN_ROWS = {"conll2003": 14041, "uner_en": 12543, "qed": 7638}
DEFAULT_GPUS = 8


def price_suite(protocol: ProtocolConfig, shapes: dict[str, EncoderShape], tasks: list[str] | None = None,
                manifest: dict | None = None, gpus: int = DEFAULT_GPUS, mfu: float = DEFAULT_MFU,
                peak: str = DEFAULT_PEAK) -> list[str]:
    """Lines: per model its device-hours and wall time on `gpus` GPUs, and what the figures assume."""
    names = tasks or list(PAPER_TASKS)
    runs = len(protocol.learning_rates) * len(protocol.seeds)
    lines = ["", f"cost per model, fine-tuning only, at {mfu:.0%} MFU of the {peak} bf16 peak (assumed, not "
                 f"measured), wall time with the longest runs first on {gpus} GPUs:"]
    assumed_rows = []
    for label, shape in shapes.items():
        unit_hours = []
        for name in names:
            _, steps, models = task_budget(protocol, name, manifest)
            if steps is None:
                rows = ASSUMED_TRAIN_ROWS[name]
                steps = math.ceil(rows / protocol.batch_size)
                assumed_rows.append(name)
            hours = device_hours(models * training_flops(shape, steps, protocol.batch_size, ASSUMED_TOKENS[name]),
                                 mfu, peak)
            unit_hours += [hours] * runs
        total = sum(unit_hours)
        lines.append(f"  {label}: {len(unit_hours)} runs, {hours_text(total)} GPU-hours, "
                     f"{hours_text(wall_hours(unit_hours, gpus))} on {gpus} GPUs")
    assumed = ", ".join(f"{name} {tokens}" for name, tokens in ASSUMED_TOKENS.items() if name in names)
    lines.append(f"  tokens per training row assumed: {assumed}")
    if assumed_rows:
        lines.append(f"  training rows assumed (no --data-root): "
                     f"{', '.join(f'{k} {ASSUMED_TRAIN_ROWS[k]:,}' for k in dict.fromkeys(assumed_rows))}")
    return lines
