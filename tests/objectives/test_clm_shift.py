import torch

from mlmclm.objectives import IGNORE_INDEX, ObjectiveConfig, build_objective

BOS, EOS, MASK, PAD = 0, 1, 2, 3


def clm(**kw):
    return build_objective(ObjectiveConfig(kind="clm"), special_token_ids=[BOS, EOS, MASK, PAD], mask_token_id=MASK,
                           vocab_size=100, seed=0, **kw)


def test_clm_shift_hand_built():
    tokens = torch.tensor([[BOS, 10, 11, 12, EOS, BOS, 20, 21],
                           [BOS, 30, 31, EOS, PAD, PAD, PAD, PAD]])
    out = clm(pad_token_id=PAD).prepare(tokens, torch.tensor([0, 1]))
    I = IGNORE_INDEX
    assert out.labels.tolist() == [[10, 11, 12, EOS, BOS, 20, 21, I],
                                   [30, 31, EOS, I, I, I, I, I]]
    assert out.loss_mask.tolist() == [[1, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0, 0]]
    assert torch.equal(out.input_ids, tokens) and out.causal is True
    assert out.num_predicted.item() == 10
    assert out.input_ids.shape == tokens.shape  # sequence length kept


def test_clm_without_pad_id_excludes_all_specials():
    tokens = torch.tensor([[BOS, 10, EOS, BOS, 20, PAD]])
    out = clm().prepare(tokens, torch.tensor([0]))
    assert out.labels.tolist() == [[10, IGNORE_INDEX, IGNORE_INDEX, 20, IGNORE_INDEX, IGNORE_INDEX]]
    assert ((out.labels >= 0) == out.loss_mask.bool()).all()
