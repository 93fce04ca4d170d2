"""Objectives on random-length samples laid end to end: each sample gets the labels and masks it gets alone."""
import torch

from mlmclm.objectives import IGNORE_INDEX, ObjectiveConfig, build_objective

LENGTHS = [5, 9, 4]
SPECIAL = [0, 1, 2, 3]


def laid_end_to_end(tokens, pad=3):
    """One row of the samples, padded by `pad` tokens; per-token sample ids (-1 on padding) and positions."""
    ids = torch.cat([torch.full((n,), 10 + k) for k, n in enumerate(LENGTHS)] + [torch.full((pad,), -1)])
    positions = torch.cat([torch.arange(n) for n in LENGTHS] + [torch.arange(pad)])
    row = torch.cat([tokens, torch.full((pad,), 2)])
    return row[None], ids[None], positions[None]


def objectives():
    kwargs = dict(special_token_ids=SPECIAL, mask_token_id=3, vocab_size=100, seed=11, pad_token_id=2)
    return (build_objective(ObjectiveConfig("clm"), **kwargs),
            build_objective(ObjectiveConfig("mlm", mask_ratio=0.5), **kwargs),
            build_objective(ObjectiveConfig("mlm", mask_ratio=0.5, mask_mode="80_10_10"), **kwargs))


def test_each_sample_is_labelled_and_masked_as_if_alone():
    tokens = torch.randint(4, 100, (sum(LENGTHS),), generator=torch.Generator().manual_seed(0))
    row, ids, positions = laid_end_to_end(tokens)
    for objective in objectives():
        packed = objective.prepare(row, ids, positions)
        start = 0
        for k, n in enumerate(LENGTHS):
            alone = objective.prepare(tokens[start:start + n][None], torch.tensor([10 + k]))
            for field in ("input_ids", "labels", "loss_mask"):
                assert torch.equal(getattr(packed, field)[0, start:start + n], getattr(alone, field)[0]), \
                    (objective.name, k, field)
            start += n
        # Padding is never predicted, and CLM predicts nothing across a sample's end.
        assert (packed.labels[0, start:] == IGNORE_INDEX).all() and (packed.loss_mask[0, start:] == 0).all()
        assert int(packed.num_predicted) == int(packed.loss_mask.sum())
    clm = objectives()[0].prepare(row, ids, positions)
    ends = torch.tensor(LENGTHS).cumsum(0) - 1
    assert (clm.labels[0, ends] == IGNORE_INDEX).all()
    # One sample per row (the fixed-row layout) is unchanged: its last token has no label, the rest do.
    assert int(objectives()[0].prepare(tokens[None], torch.tensor([0])).loss_mask.sum()) == sum(LENGTHS) - 1
