"""The MLM mask rate over a phase's steps: constant, or falling (or rising) from a start to an end rate.

Production encoders lower the mask rate late in training (Ettin 30 % -> 15 % in its decay; mmBERT 30 -> 15 -> 5 %
by phase), and Ankner et al. 2023 ("Dynamic Masking Rate Schedules for MLM Pretraining") lower it linearly from
30 % to 15 % inside one run. The rate of a step is a pure function of the step's index inside its phase, so masks
stay a function of (seed, sample, position, step): the same on every layout and after every resume.

With n steps in the phase and i = 0 .. n-1 the step inside it, t = i / (n - 1) (t = 0 when n = 1):
    constant: start
    linear:   start + (end - start) * t
    cosine:   end + (start - end) * (1 + cos(pi * t)) / 2      (flat at both ends, steepest midway)
The first step trains at `start`, the last at `end`; both schedules average (start + end) / 2 over the phase.
"""
from __future__ import annotations

import math

SCHEDULES = ("constant", "linear", "cosine")


def mask_ratio_at(start: float, end: float, schedule: str, step: int, steps: int) -> float:
    """The mask rate of step `step` (0-based) of a phase of `steps` steps."""
    if schedule not in SCHEDULES:
        raise ValueError(f"mask schedule must be one of {SCHEDULES}, got {schedule!r}")
    if not 0 <= step < steps:
        raise ValueError(f"step {step} is outside the phase's {steps} steps")
    if schedule == "constant":
        return start
    t = step / (steps - 1) if steps > 1 else 0.0
    if schedule == "linear":
        return start + (end - start) * t
    return end + (start - end) * (1.0 + math.cos(math.pi * t)) / 2.0
