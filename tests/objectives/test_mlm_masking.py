import pytest
import torch

from mlmclm.objectives import IGNORE_INDEX, ObjectiveConfig, build_objective
from mlmclm.objectives.hashing import splitmix64, splitmix64_reference

SPECIALS = [0, 1, 2, 3]  # bos, eos, mask, pad
MASK, VOCAB = 2, 1000


def mlm(mode="mask_only", ratio=0.3, seed=7):
    cfg = ObjectiveConfig(kind="mlm", mask_ratio=ratio, mask_mode=mode)
    return build_objective(cfg, special_token_ids=SPECIALS, mask_token_id=MASK, vocab_size=VOCAB, seed=seed)


def batch(b=64, s=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, VOCAB, (b, s), generator=g)
    tokens[:, 0] = 0                     # BOS
    tokens[:, 100] = 1                   # EOS mid-row
    tokens[:, 101] = 0
    tokens[: b // 2, -50:] = 3           # padding
    return tokens, torch.arange(b) + 10_000


def test_splitmix64_matches_reference():
    xs = [0, 1, 2, 12345, 2**62 + 17, -1, -(2**63)]
    got = splitmix64(torch.tensor(xs, dtype=torch.int64)).tolist()
    for x, y in zip(xs, got):
        assert y % 2**64 == splitmix64_reference(x % 2**64)


@pytest.mark.parametrize("ratio", [0.15, 0.3, 0.4, 0.7])
def test_selected_fraction_and_labels(ratio):
    tokens, ids = batch()
    out = mlm(ratio=ratio).prepare(tokens, ids)
    special = torch.isin(tokens, torch.tensor(SPECIALS))
    selected = out.loss_mask.bool()
    assert not (selected & special).any(), "special tokens must never be selected"
    frac = selected.sum().item() / (~special).sum().item()
    assert abs(frac - ratio) < 0.01, frac
    assert torch.equal(out.labels[selected], tokens[selected])
    assert (out.labels[~selected] == IGNORE_INDEX).all()
    assert (out.input_ids[selected] == MASK).all()
    assert torch.equal(out.input_ids[~selected], tokens[~selected])
    assert out.num_predicted.item() == selected.sum().item()
    assert out.causal is False and out.loss_mask.dtype == torch.float32


def test_80_10_10_split():
    tokens, ids = batch(b=128)
    out = mlm(mode="80_10_10", ratio=0.4).prepare(tokens, ids)
    selected = out.loss_mask.bool()
    n = selected.sum().item()
    masked = (selected & (out.input_ids == MASK)).sum().item() / n
    kept = (selected & (out.input_ids == tokens)).sum().item() / n
    replaced = (selected & (out.input_ids != MASK) & (out.input_ids != tokens)).sum().item() / n
    assert abs(masked - 0.8) < 0.01 and abs(kept - 0.1) < 0.01 and abs(replaced - 0.1) < 0.01, (masked, kept, replaced)
    assert not torch.isin(out.input_ids[selected & (out.input_ids != MASK)], torch.tensor(SPECIALS)).any()
    assert (out.input_ids[~selected] == tokens[~selected]).all()


def test_same_sample_same_mask_different_sample_different_mask():
    tokens, ids = batch(b=8)
    obj = mlm()
    a = obj.prepare(tokens, ids)
    # Same rows, in a different order and a different batch split: each sample masks identically.
    perm = torch.tensor([5, 2, 7, 0])
    b = obj.prepare(tokens[perm], ids[perm])
    assert torch.equal(a.input_ids[perm], b.input_ids) and torch.equal(a.labels[perm], b.labels)
    # The same tokens under other sample ids (or another seed) mask differently.
    c = obj.prepare(tokens, ids + 1)
    assert not torch.equal(a.loss_mask, c.loss_mask)
    assert all(not torch.equal(a.loss_mask[i], c.loss_mask[i]) for i in range(8))
    assert not torch.equal(a.loss_mask, mlm(seed=8).prepare(tokens, ids).loss_mask)
    # Rows within one sample do not repeat a pattern either.
    assert not torch.equal(a.loss_mask[0, :256], a.loss_mask[0, 256:])


@pytest.mark.parametrize("bad", [dict(kind="bert"), dict(kind="mlm", mask_ratio=0.0), dict(kind="mlm", mask_ratio=1.0),
                                 dict(kind="mlm", mask_mode="mask_some")])
def test_config_validation(bad):
    with pytest.raises(ValueError):
        ObjectiveConfig(**bad)
