"""The chunked output layer + cross entropy against megatron's own: the output layer's matmul followed by
`tensor_parallel.vocab_parallel_cross_entropy`, in-process on a one-rank gloo group (the TP shards, SP, PP and DP
are compared in the spawned runs of test_parallel_equivalence and train_scenarios)."""
import pytest
import torch
import torch.distributed as dist
from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

from mlmclm.model.chunked_head import ChunkedLinearCE, validate_chunk_tokens

TOKENS, HIDDEN, VOCAB = 53, 32, 1000


@pytest.fixture(scope="module")
def group():
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _inputs(dtype):
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(TOKENS, HIDDEN, generator=gen).to(dtype).requires_grad_()
    weight = (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.5).to(dtype).requires_grad_()
    labels = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    grad_out = torch.rand(TOKENS, generator=gen)  # per-token weights, as the loss mask and the 1/tokens give
    return hidden, weight, labels, grad_out


def _megatron(hidden, weight, labels, grad_out, group):
    logits = hidden @ weight.t()
    correct = (logits.float().gather(-1, labels[:, None]).squeeze(-1) >= logits.float().max(-1).values).float()
    # megatron's [s, b, v] with b = 1, labels [s, b]
    losses = vocab_parallel_cross_entropy(logits.unsqueeze(1), labels.unsqueeze(1), tp_group=group).squeeze(1)
    (losses * grad_out).sum().backward()
    return losses.detach(), correct, hidden.grad, weight.grad


def _chunked(hidden, weight, labels, grad_out, group, chunk):
    losses, correct = ChunkedLinearCE.apply(hidden, weight, labels, chunk, group)
    (losses * grad_out).sum().backward()
    return losses.detach(), correct, hidden.grad, weight.grad


@pytest.mark.parametrize("chunk", [1, 16, TOKENS, 4 * TOKENS])
def test_fp32_losses_gradients_and_accuracy_match_megatrons_cross_entropy(group, chunk):
    ref = _megatron(*_inputs(torch.float32), group)
    got = _chunked(*_inputs(torch.float32), group, chunk)
    assert (got[0] - ref[0]).abs().max() <= 1e-6 * ref[0].abs().max()
    assert torch.equal(got[1], ref[1])
    for mine, theirs in zip(got[2:], ref[2:]):
        assert (mine - theirs).abs().max() <= 1e-5 * theirs.abs().max()


def test_bf16_matches_megatron_to_bf16_rounding(group):
    ref = _megatron(*_inputs(torch.bfloat16), group)
    got = _chunked(*_inputs(torch.bfloat16), group, 16)
    assert got[0].dtype == torch.float32 and got[2].dtype == got[3].dtype == torch.bfloat16
    assert (got[0] - ref[0]).abs().max() <= 1e-5 * ref[0].abs().max()  # same bf16 logits, fp32 arithmetic
    assert torch.equal(got[1], ref[1])
    for mine, theirs in zip(got[2:], ref[2:]):
        assert (mine.float() - theirs.float()).abs().max() <= 2e-2 * theirs.float().abs().max()


def test_accuracy_counts_a_planted_argmax(group):
    hidden, weight, labels, _ = _inputs(torch.float32)
    with torch.no_grad():
        labels = (hidden @ weight.t()).argmax(-1)
        labels[::2] = (labels[::2] + 1) % VOCAB
    _, correct = ChunkedLinearCE.apply(hidden.detach(), weight.detach(), labels, 8, group)
    assert correct.tolist() == [float(i % 2) for i in range(TOKENS)]


def test_nothing_vocab_sized_is_kept_for_backward_but_the_weight(group):
    """Only the inputs and one fp32 number per token are saved: the logits are recomputed in the backward."""
    hidden, weight, labels, grad_out = _inputs(torch.float32)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(tuple(t.shape)) or t, lambda t: t):
        losses, _ = ChunkedLinearCE.apply(hidden, weight, labels, 16, group)
    assert sorted(saved) == sorted([(TOKENS, HIDDEN), (VOCAB, HIDDEN), (TOKENS,), (TOKENS,)])
    (losses * grad_out).sum().backward()  # and the backward still runs from them


def test_no_tokens_give_no_loss_and_zero_weight_gradient(group):
    hidden, weight, labels, _ = _inputs(torch.float32)
    losses, correct = ChunkedLinearCE.apply(hidden[:0], weight, labels[:0], 16, group)
    assert losses.shape == correct.shape == (0,)
    losses.sum().backward()
    assert torch.count_nonzero(weight.grad) == 0


@pytest.mark.parametrize("bad", [0, -4, 2.5, True, "256"])
def test_chunk_size_must_be_a_positive_whole_number(bad):
    with pytest.raises(ValueError, match="chunk size"):
        validate_chunk_tokens(bad)
