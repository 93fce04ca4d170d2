"""Training objectives: pure functions from a packed token batch to model inputs, labels and a loss mask.

    objective = build_objective(ObjectiveConfig(kind="mlm"), special_token_ids=[...], mask_token_id=..,
                                vocab_size=.., seed=..)
    batch = objective.prepare(tokens, sample_ids)   # on the device `tokens` lives on
    batch = objective.prepare(tokens, sample_ids, positions)   # samples laid end to end: ids, positions per token

`labels` is IGNORE_INDEX where nothing is predicted and a valid token id wherever `loss_mask` is 1.
The loss itself (vocab-parallel cross entropy, accuracy) lives in `mlmclm.objectives.loss`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mlmclm.objectives.batch import IGNORE_INDEX, Objective, ObjectiveBatch
from mlmclm.objectives.clm import CausalLM
from mlmclm.objectives.mask_schedule import SCHEDULES, mask_ratio_at
from mlmclm.objectives.mlm import MaskedLM

__all__ = ["IGNORE_INDEX", "Objective", "ObjectiveBatch", "ObjectiveConfig", "build_objective",
           "objective_for_tokenizer"]

KINDS = ("clm", "mlm")
MASK_MODES = ("mask_only", "80_10_10")


@dataclass
class ObjectiveConfig:
    kind: Literal["clm", "mlm"]
    mask_ratio: float = 0.4  # MLM: the rate (a schedule's start)
    mask_mode: Literal["mask_only", "80_10_10"] = "mask_only"
    # MLM mask-rate schedule over the phase's steps (mlmclm/objectives/mask_schedule.py): "constant" (mask_ratio
    # throughout), or "linear" / "cosine" from mask_ratio at the phase's first step to mask_ratio_end at its last.
    mask_schedule: Literal["constant", "linear", "cosine"] = "constant"
    mask_ratio_end: float | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"objective kind must be one of {KINDS}, got {self.kind!r}")
        if not 0.0 < float(self.mask_ratio) < 1.0:
            raise ValueError(f"mask_ratio must be strictly between 0 and 1, got {self.mask_ratio!r}")
        if self.mask_mode not in MASK_MODES:
            raise ValueError(f"mask_mode must be one of {MASK_MODES}, got {self.mask_mode!r}")
        if self.mask_schedule not in SCHEDULES:
            raise ValueError(f"mask_schedule must be one of {SCHEDULES}, got {self.mask_schedule!r}")
        if self.mask_schedule == "constant":
            if self.mask_ratio_end is not None and self.mask_ratio_end != self.mask_ratio:
                raise ValueError(f"mask_ratio_end {self.mask_ratio_end!r} needs a mask_schedule (linear or cosine); "
                                 f"the constant schedule keeps mask_ratio {self.mask_ratio!r}")
        else:
            if self.kind != "mlm":
                raise ValueError(f"mask_schedule {self.mask_schedule!r} is for MLM; a {self.kind} phase masks nothing")
            if self.mask_ratio_end is None:
                raise ValueError(f"mask_schedule {self.mask_schedule!r} needs mask_ratio_end (the last step's rate)")
            if not 0.0 < float(self.mask_ratio_end) < 1.0:
                raise ValueError(f"mask_ratio_end must be strictly between 0 and 1, got {self.mask_ratio_end!r}")

    def ratio_at(self, step: int, steps: int) -> float:
        """The MLM mask rate of step `step` (0-based) of a phase of `steps` steps."""
        end = self.mask_ratio if self.mask_ratio_end is None else self.mask_ratio_end
        return mask_ratio_at(self.mask_ratio, end, self.mask_schedule, step, steps)

    @property
    def mean_ratio(self) -> float:
        """The rate averaged over the phase (both schedules are symmetric about the midpoint)."""
        return self.mask_ratio if self.mask_ratio_end is None else (self.mask_ratio + self.mask_ratio_end) / 2

    @property
    def max_ratio(self) -> float:
        """The highest rate of the phase (the sparse head's largest step, for memory plans)."""
        return self.mask_ratio if self.mask_ratio_end is None else max(self.mask_ratio, self.mask_ratio_end)


def build_objective(
    cfg: ObjectiveConfig,
    *,
    special_token_ids: list[int],
    mask_token_id: int,
    vocab_size: int,
    seed: int,
    pad_token_id: int | None = None,
) -> Objective:
    """The objective for `cfg`. `special_token_ids` are never masked by MLM. CLM never predicts padding: with
    `pad_token_id` only the pad (and mask) ids are excluded from labels, without it every special id is."""
    if cfg.kind == "clm":
        no_label = special_token_ids if pad_token_id is None else [pad_token_id, mask_token_id]
        no_label = [i for i in no_label if i is not None]
        return CausalLM(no_label_ids=no_label)
    return MaskedLM(
        mask_ratio=cfg.mask_ratio, mask_mode=cfg.mask_mode, special_token_ids=special_token_ids,
        mask_token_id=mask_token_id, vocab_size=vocab_size, seed=seed,
    )


def objective_for_tokenizer(cfg: ObjectiveConfig, tokenizer: dict, seed: int) -> Objective:
    """The objective for data prepared with `tokenizer` (a manifest's tokenizer identity): its BOS, EOS, mask and
    pad ids are the special tokens."""
    special = [tokenizer.get(role) for role in ("bos_id", "eos_id", "mask_id", "pad_id")]
    return build_objective(cfg, special_token_ids=[i for i in special if i is not None],
                           mask_token_id=tokenizer.get("mask_id"), vocab_size=tokenizer["vocab_size"], seed=seed,
                           pad_token_id=tokenizer.get("pad_id"))
