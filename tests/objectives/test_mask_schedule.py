"""Mask-rate schedules (issue 34): the rate of a step is a pure function of the step inside its phase; a config
that cannot be followed is refused naming the field; the masks realise the rate."""
import math

import pytest
import torch

from mlmclm.objectives import ObjectiveConfig, build_objective
from mlmclm.objectives.mask_schedule import mask_ratio_at


def test_linear_and_cosine_run_from_start_to_end_over_the_phase():
    steps = 11
    linear = [mask_ratio_at(0.3, 0.15, "linear", i, steps) for i in range(steps)]
    cosine = [mask_ratio_at(0.3, 0.15, "cosine", i, steps) for i in range(steps)]
    assert linear[0] == cosine[0] == 0.3 and linear[-1] == pytest.approx(0.15) and cosine[-1] == pytest.approx(0.15)
    assert linear[5] == pytest.approx(0.225) and cosine[5] == pytest.approx(0.225)       # both symmetric midway
    assert all(a > b for a, b in zip(linear, linear[1:])) and all(a > b for a, b in zip(cosine, cosine[1:]))
    assert cosine[1] > linear[1] and cosine[9] < linear[9]                                 # cosine: flat at the ends
    assert cosine[3] == pytest.approx(0.15 + 0.15 * (1 + math.cos(math.pi * 0.3)) / 2)
    assert [mask_ratio_at(0.3, 0.15, "constant", i, steps) for i in range(steps)] == [0.3] * steps
    assert mask_ratio_at(0.2, 0.4, "linear", 0, 1) == 0.2                                # a one-step phase: start
    rising = [mask_ratio_at(0.15, 0.3, "linear", i, 4) for i in range(4)]
    assert rising == pytest.approx([0.15, 0.2, 0.25, 0.3])


def test_the_config_gives_each_step_its_rate_and_the_phase_mean():
    cfg = ObjectiveConfig("mlm", mask_ratio=0.3, mask_schedule="cosine", mask_ratio_end=0.1)
    assert [cfg.ratio_at(i, 3) for i in range(3)] == pytest.approx([0.3, 0.2, 0.1])
    assert cfg.mean_ratio == pytest.approx(0.2) and cfg.max_ratio == 0.3
    constant = ObjectiveConfig("mlm", mask_ratio=0.4)
    assert constant.ratio_at(5, 10) == constant.mean_ratio == constant.max_ratio == 0.4


@pytest.mark.parametrize("fields, message", [
    ({"kind": "mlm", "mask_schedule": "linear"}, "needs mask_ratio_end"),
    ({"kind": "mlm", "mask_schedule": "linear", "mask_ratio_end": 1.0}, "mask_ratio_end must be strictly"),
    ({"kind": "mlm", "mask_schedule": "cosine", "mask_ratio_end": 0.0}, "mask_ratio_end must be strictly"),
    ({"kind": "mlm", "mask_ratio_end": 0.15}, "needs a mask_schedule"),
    ({"kind": "mlm", "mask_schedule": "step", "mask_ratio_end": 0.15}, "mask_schedule must be one of"),
    ({"kind": "clm", "mask_schedule": "linear", "mask_ratio_end": 0.15}, "is for MLM"),
])
def test_a_schedule_that_cannot_be_followed_is_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        ObjectiveConfig(**fields)


def test_the_masks_realise_the_steps_rate_and_a_lower_rate_masks_a_subset():
    """Counter-based selection: random < rate. So each step's realised rate follows its scheduled rate, and the
    tokens masked at 15 % are among those masked at 30 % (the same draw, cut lower)."""
    objective = build_objective(ObjectiveConfig("mlm", mask_ratio=0.3), special_token_ids=[0, 1],
                                mask_token_id=2, vocab_size=1000, seed=7)
    tokens = torch.randint(3, 1000, (16, 512))
    ids = torch.arange(16)
    high = objective.prepare(tokens, ids, mask_ratio=0.3)
    low = objective.prepare(tokens, ids, mask_ratio=0.15)
    default = objective.prepare(tokens, ids)
    n = tokens.numel()
    for batch, rate in ((high, 0.3), (low, 0.15)):
        assert int(batch.num_maskable) == n
        assert abs(int(batch.num_predicted) / n - rate) < 4 * math.sqrt(rate * (1 - rate) / n)
    assert bool((low.loss_mask <= high.loss_mask).all()) and int(low.num_predicted) < int(high.num_predicted)
    assert torch.equal(default.loss_mask, high.loss_mask)   # no rate given: the objective's own
    with pytest.raises(ValueError, match="mask ratio must be strictly between 0 and 1"):
        objective.prepare(tokens, ids, mask_ratio=0.0)
