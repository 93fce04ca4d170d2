"""The chunked output layer + cross entropy against megatron's own: the output layer's matmul followed by
`tensor_parallel.vocab_parallel_cross_entropy`, in-process on a one-rank gloo group (the TP shards, SP, PP and DP
are compared in the spawned runs of test_parallel_equivalence and train_scenarios).

The chunked function computes its gradients in the forward for the reduction it is given (Σ token weight × loss),
so the failure modes it adds are checked here: a non-unit incoming gradient, accumulation over micro-batches, a
retained graph's second backward, no gradient work without grad, and the count of output-layer matmuls."""
import math

import pytest
import torch
import torch.distributed as dist
from megatron.core.tensor_parallel import vocab_parallel_cross_entropy
from torch.utils._python_dispatch import TorchDispatchMode

from mlmclm.model.chunked_head import chunked_linear_cross_entropy, validate_chunk_tokens

TOKENS, HIDDEN, VOCAB = 53, 32, 1000


@pytest.fixture(scope="module")
def group():
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def _inputs(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, HIDDEN, generator=gen).to(dtype).requires_grad_()
    weight = (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.5).to(dtype).requires_grad_()
    labels = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    token_weights = torch.rand(TOKENS, generator=gen)  # non-uniform, as a loss mask times anything would be
    token_weights[::7] = 0  # and masked-out tokens
    return hidden, weight, labels, token_weights


def _megatron(hidden, weight, labels, token_weights, group, incoming=1.0):
    logits = hidden @ weight.t()
    correct = (logits.float().gather(-1, labels[:, None]).squeeze(-1) >= logits.float().max(-1).values).float()
    # megatron's [s, b, v] with b = 1, labels [s, b]
    losses = vocab_parallel_cross_entropy(logits.unsqueeze(1), labels.unsqueeze(1), tp_group=group).squeeze(1)
    loss = (losses * token_weights).sum()
    (loss * incoming).backward()
    return loss.detach(), losses.detach(), correct, hidden.grad, weight.grad


def _chunked(hidden, weight, labels, token_weights, group, chunk, incoming=1.0):
    loss, losses, correct = chunked_linear_cross_entropy(hidden, weight, labels, token_weights, chunk, group)
    (loss * incoming).backward()
    return loss.detach(), losses, correct, hidden.grad, weight.grad


def _assert_close(got, ref, loss_tol=1e-6, grad_tol=1e-5):
    for mine, theirs in zip(got[:2], ref[:2]):  # the weighted sum, the per-token losses
        assert (mine - theirs).abs().max() <= loss_tol * theirs.abs().max()
    assert torch.equal(got[2], ref[2])
    for mine, theirs in zip(got[3:], ref[3:]):
        assert (mine.float() - theirs.float()).abs().max() <= grad_tol * theirs.float().abs().max()


@pytest.mark.parametrize("chunk", [1, 16, TOKENS, 4 * TOKENS])
def test_fp32_losses_gradients_and_accuracy_match_megatrons_cross_entropy(group, chunk):
    _assert_close(_chunked(*_inputs(torch.float32), group, chunk), _megatron(*_inputs(torch.float32), group))


def test_a_non_unit_incoming_gradient_scales_both_gradients(group):
    """megatron's schedule divides the summed loss by the token count and the loss scale multiplies it: the
    backward receives a scalar other than 1, and the gradients made in the forward must be scaled by it."""
    ref = _megatron(*_inputs(torch.float32), group, incoming=0.037)
    got = _chunked(*_inputs(torch.float32), group, 16, incoming=0.037)
    _assert_close(got, ref)
    unit = _chunked(*_inputs(torch.float32), group, 16)
    assert not torch.allclose(unit[3], got[3])  # it did matter


def test_no_token_weights_means_every_token_counts_once(group):
    hidden, weight, labels, _ = _inputs(torch.float32)
    ref = _megatron(hidden, weight, labels, torch.ones(TOKENS), group)
    _assert_close(_chunked(*_inputs(torch.float32)[:3], None, group, 16), ref)


def test_gradients_accumulate_over_micro_batches(group):
    """Two micro-batches, each its own forward and backward into the same weight, as the schedules run them."""
    def run(fn, extra):
        hidden, weight, labels, token_weights = _inputs(torch.float32)
        second = _inputs(torch.float32, seed=1)[0].detach().requires_grad_()
        fn(hidden, weight, labels, token_weights, group, *extra, incoming=0.5)
        fn(second, weight, labels.flip(0), token_weights.flip(0), group, *extra, incoming=0.25)
        return hidden.grad, second.grad, weight.grad

    for mine, theirs in zip(run(_chunked, (16,)), run(_megatron, ())):
        assert (mine - theirs).abs().max() <= 1e-5 * theirs.abs().max()


def test_a_retained_graph_gives_the_same_gradients_again(group):
    hidden, weight, labels, token_weights = _inputs(torch.float32)
    loss, _, _ = chunked_linear_cross_entropy(hidden, weight, labels, token_weights, 16, group)
    loss.backward(retain_graph=True)
    first = hidden.grad.clone(), weight.grad.clone()
    (loss * 3).backward()
    assert torch.allclose(hidden.grad, 4 * first[0], rtol=1e-6, atol=0)
    assert torch.allclose(weight.grad, 4 * first[1], rtol=1e-6, atol=0)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()  # freed after a backward without retain_graph, as any autograd graph


def test_bf16_matches_megatron_to_bf16_rounding(group):
    ref = _megatron(*_inputs(torch.bfloat16), group)
    got = _chunked(*_inputs(torch.bfloat16), group, 16)
    assert got[0].dtype == got[1].dtype == torch.float32 and got[3].dtype == got[4].dtype == torch.bfloat16
    _assert_close(got, ref, loss_tol=1e-5, grad_tol=2e-2)  # same bf16 logits, fp32 arithmetic; bf16 gradients


def test_accuracy_counts_a_planted_argmax(group):
    hidden, weight, labels, _ = _inputs(torch.float32)
    with torch.no_grad():
        labels = (hidden @ weight.t()).argmax(-1)
        labels[::2] = (labels[::2] + 1) % VOCAB
    _, _, correct = chunked_linear_cross_entropy(hidden.detach(), weight.detach(), labels, None, 8, group)
    assert correct.tolist() == [float(i % 2) for i in range(TOKENS)]


class OutputLayerMatmuls(TorchDispatchMode):
    """Counts the aten matmuls that involve the vocabulary dimension (the output layer's: logits, input gradient,
    weight gradient) as the dispatcher runs them, autograd's backward kernels included."""

    MATMULS = {"mm", "addmm", "bmm", "baddbmm", "matmul", "addmm_"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.__name__.split(".")[0] in self.MATMULS and any(
                isinstance(a, torch.Tensor) and VOCAB in a.shape for a in (*args, *kwargs.values())):
            self.count += 1
        return func(*args, **kwargs)


def _count_matmuls(fn, chunk, grad=True):
    hidden, weight, labels, token_weights = _inputs(torch.float32)
    forward, backward = OutputLayerMatmuls(), OutputLayerMatmuls()
    with torch.set_grad_enabled(grad), forward:
        loss = fn(hidden, weight, labels, token_weights, chunk)
    if grad:
        with backward:
            loss.backward()
    return forward.count, backward.count, loss


def test_three_output_layer_matmuls_per_chunk_and_none_in_the_backward(group):
    """The logits are not recomputed: the backward makes no output-layer matmul (the old head recomputed each
    chunk's logits there: 1 matmul per chunk forward, 3 backward). megatron's head, counted the same way,
    shows the counter sees backward matmuls."""
    def megatron(hidden, weight, labels, token_weights, _chunk):
        losses = vocab_parallel_cross_entropy((hidden @ weight.t()).unsqueeze(1), labels.unsqueeze(1), tp_group=group)
        return (losses.squeeze(1) * token_weights).sum()

    def chunked(hidden, weight, labels, token_weights, chunk):
        return chunked_linear_cross_entropy(hidden, weight, labels, token_weights, chunk, group)[0]

    assert _count_matmuls(megatron, None)[:2] == (1, 2)
    chunks = math.ceil(TOKENS / 16)
    assert _count_matmuls(chunked, 16)[:2] == (3 * chunks, 0)
    assert _count_matmuls(chunked, TOKENS)[:2] == (3, 0)


def test_no_gradient_work_without_grad(group):
    """Validation and evaluation (torch.no_grad) and inputs that need no gradient: the logits' matmul only."""
    def chunked(hidden, weight, labels, token_weights, chunk):
        return chunked_linear_cross_entropy(hidden, weight, labels, token_weights, chunk, group)[0]

    chunks = math.ceil(TOKENS / 16)
    forward, _, loss = _count_matmuls(chunked, 16, grad=False)
    assert forward == chunks and not loss.requires_grad
    hidden, weight, labels, token_weights = _inputs(torch.float32)
    with OutputLayerMatmuls() as counter:
        loss, _, _ = chunked_linear_cross_entropy(hidden.detach(), weight.detach(), labels, token_weights, 16, group)
    assert counter.count == chunks and not loss.requires_grad
    with OutputLayerMatmuls() as counter:  # a frozen output layer: no weight gradient
        loss, _, _ = chunked_linear_cross_entropy(hidden, weight.detach(), labels, token_weights, 16, group)
    assert counter.count == 2 * chunks
    loss.backward()
    assert hidden.grad is not None and weight.grad is None
    with torch.no_grad():  # same loss as with grad
        again, _, _ = chunked_linear_cross_entropy(hidden, weight, labels, token_weights, 16, group)
    assert torch.equal(again, loss.detach())


def test_only_the_two_gradients_are_kept_for_backward(group):
    """Held from forward to backward: the hidden states' gradient [n, h] and the weight's, fp32 [v, h]; not the
    inputs, and nothing [tokens, vocab]."""
    hidden, weight, labels, token_weights = _inputs(torch.bfloat16)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((tuple(t.shape), t.dtype)) or t,
                                                  lambda t: t):
        loss, _, _ = chunked_linear_cross_entropy(hidden, weight, labels, token_weights, 16, group)
    assert sorted(saved) == sorted([((TOKENS, HIDDEN), torch.bfloat16), ((VOCAB, HIDDEN), torch.float32)])
    loss.backward()  # and the backward runs from them


def test_no_tokens_give_no_loss_and_zero_weight_gradient(group):
    hidden, weight, labels, token_weights = _inputs(torch.float32)
    loss, losses, correct = chunked_linear_cross_entropy(hidden[:0], weight, labels[:0], token_weights[:0], 16,
                                                         group)
    assert losses.shape == correct.shape == (0,) and loss.item() == 0
    loss.backward()
    assert torch.count_nonzero(weight.grad) == 0


def test_token_weights_must_match_the_labels(group):
    hidden, weight, labels, token_weights = _inputs(torch.float32)
    with pytest.raises(ValueError, match="token_weights"):
        chunked_linear_cross_entropy(hidden, weight, labels, token_weights[:-1], 16, group)


@pytest.mark.parametrize("bad", [0, -4, 2.5, True, "256"])
def test_chunk_size_must_be_a_positive_whole_number(bad):
    with pytest.raises(ValueError, match="chunk size"):
        validate_chunk_tokens(bad)
