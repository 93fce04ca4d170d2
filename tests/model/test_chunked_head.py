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

from mlmclm.model import wgrad_gemm
from mlmclm.model.chunked_head import chunked_linear_cross_entropy
from mlmclm.model.head_chunks import validate_chunk_tokens

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


# ---- gradient-accumulation fusion (megatron's `gradient_accumulation_fusion`, apex's kernel on NGC images) -------

def _fused_weight(seed=0):
    """A bf16 output weight as megatron's DDP leaves it: an fp32 `main_grad` buffer and `grad_added_to_main_grad`."""
    weight = _inputs(torch.bfloat16, seed)[1].detach().requires_grad_()
    weight.main_grad = torch.zeros(weight.shape, dtype=torch.float32)
    weight.grad_added_to_main_grad = False
    return weight


def _ddp_hook(weight):
    """megatron-core 0.19's DDP backward hook (`_make_backward_post_hook`): a gradient autograd produced is added to
    main_grad unless the layer already accumulated it there; then dropped."""
    if weight.grad is not None and (not weight.grad_added_to_main_grad or getattr(weight, "zero_out_wgrad", False)):
        weight.main_grad.add_(weight.grad.data)
    weight.grad = None


def _micro_batches(weight, head, micro_batches=3):
    """Forward and backward of several micro-batches into one weight (grad_loss 1: per-token losses, bf16)."""
    for seed in range(micro_batches):
        hidden, _, labels, token_weights = _inputs(torch.bfloat16, seed + 10)
        head(hidden, weight, labels, token_weights).backward()
        _ddp_hook(weight)
    return weight.main_grad


def _megatron_fused_head(group):
    from megatron.core.tensor_parallel.layers import linear_with_grad_accumulation_and_async_allreduce

    def head(hidden, weight, labels, token_weights):
        logits = linear_with_grad_accumulation_and_async_allreduce(hidden, weight, None, True, False, False,
                                                                   tp_group=group)
        losses = vocab_parallel_cross_entropy(logits.unsqueeze(1), labels.unsqueeze(1), tp_group=group).squeeze(1)
        return (losses * token_weights).sum()
    return head


def _chunked_head(group, fuse_wgrad):
    return lambda hidden, weight, labels, token_weights: chunked_linear_cross_entropy(
        hidden, weight, labels, token_weights, 16, group, fuse_wgrad=fuse_wgrad)[0]


def test_fused_weight_gradient_equals_megatrons_fused_head_in_fp32(group, monkeypatch):
    """With the fusion, megatron's head accumulates the weight gradient of every micro-batch in fp32 into
    main_grad; the chunked head must too. Rounding each micro-batch's gradient to bf16 first (the chunked head
    before, and now without the fusion, as megatron's unfused head) is ~1e-3 off in norm."""
    from tests.stand_ins import apex_wgrad

    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")  # megatron makes its dummy "on the GPU"

    with apex_wgrad.installed() as calls:
        reference = _micro_batches(_fused_weight(), _megatron_fused_head(group))
        assert calls["wgrad_gemm_accum_fp32"] == 3  # megatron's layer really took the fused path
        calls.clear()
        fused = _micro_batches(_fused_weight(), _chunked_head(group, fuse_wgrad=True))
        assert calls["wgrad_gemm_accum_fp32"] == 3 * math.ceil(TOKENS / 16)  # one accumulating GEMM per chunk
    rounded = _micro_batches(_fused_weight(), _chunked_head(group, fuse_wgrad=False))

    def gap(grad):
        return float((grad - reference).norm() / reference.norm())

    print(f"relative gap to megatron's fused head: fused {gap(fused):.2e}, rounded {gap(rounded):.2e}")
    assert gap(fused) <= 1e-5, gap(fused)
    assert gap(rounded) > 1e-4, gap(rounded)  # what the test tells apart: bf16 rounding per micro-batch


def test_fused_path_returns_megatrons_dummy_and_makes_no_vocab_sized_copies(group):
    """The backward hands autograd a dummy (DDP then skips the add) and marks the weight; zeros when the weight is
    shared with the embedding (`zero_out_wgrad`, whose own gradient DDP still adds). The forward makes no
    [vocab, hidden] tensor per chunk — the accumulating GEMM writes the fp32 sum in place."""
    from tests.stand_ins import apex_wgrad

    class VocabByHidden(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.made = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            in_place = func.__name__.split(".")[0].endswith("_")
            if isinstance(out, torch.Tensor) and tuple(out.shape) == (VOCAB, HIDDEN) and not in_place:
                self.made += 1
            return out

    with apex_wgrad.installed():
        for shared in (False, True):
            weight = _fused_weight()
            if shared:
                weight.zero_out_wgrad = True
            hidden, _, labels, token_weights = _inputs(torch.bfloat16, 10)
            with VocabByHidden() as forward:
                loss, _, _ = chunked_linear_cross_entropy(hidden, weight, labels, token_weights, 16, group,
                                                          fuse_wgrad=True)
            assert forward.made == 1  # the fp32 sum itself, once
            loss.backward()
            assert weight.grad_added_to_main_grad is True and weight.grad.shape == weight.shape
            assert weight.main_grad.abs().sum() > 0
            if shared:
                assert torch.count_nonzero(weight.grad) == 0
        weight = _fused_weight()
        with VocabByHidden() as unfused:
            chunked_linear_cross_entropy(hidden, weight, labels, token_weights, 16, group)
        assert unfused.made == 1  # unfused too: the fp32-accumulating GEMM (before issue 55: 2 more per chunk)
        assert wgrad_gemm.last_path == wgrad_gemm.UPCAST  # bf16 on CPU (tests/model/test_wgrad_gemm.py: the rest)


def _fused_model_worker(out_path):
    """A bf16 model built as on an NGC image (gradient_accumulation_fusion on: apex's kernel, here its stand-in),
    its DDP buffers, one CLM and one sparse-MLM step's forward/backward with each head."""
    from mlmclm.model import ModelConfig, build_model, fusions, set_causal
    from mlmclm.model.precision import PrecisionConfig
    from mlmclm.objectives import ObjectiveConfig, build_objective
    from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel
    from mlmclm.train.optim import OptimizerConfig, build_optimizer, wrap_ddp
    from mlmclm.train.step import configure_model_for_schedules, forward_backward
    from tests.stand_ins import apex_wgrad

    apex_wgrad.install()
    fusions.probe_kernels = lambda: fusions.KernelAvailability(gpu=None, apex_softmax="absent", apex_wgrad=None,
                                                               jit_fuser="absent", te_rope="absent")
    init_parallel(ParallelConfig(), seed=3)
    torch.manual_seed(0)
    shape = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                        vocab_size=1000, max_position_embeddings=64, make_vocab_divisible_by=8)
    chunks = build_model(shape, ParallelConfig(), PrecisionConfig(dtype="bf16"), causal=True)
    ddp = wrap_ddp(chunks, distributed_optimizer=False)
    configure_model_for_schedules(ddp, build_optimizer(ddp, OptimizerConfig(lr=1e-3)))
    weight = chunks[0].output_layer.weight
    out = {"fusion": bool(chunks[0].config.gradient_accumulation_fusion)}
    tokens = torch.randint(4, 1000, (2, 48), generator=torch.Generator().manual_seed(1))
    for kind in ("clm", "mlm"):
        objective = build_objective(ObjectiveConfig(kind, mask_ratio=0.4), special_token_ids=[0, 1, 2, 3],
                                    mask_token_id=3, vocab_size=1000, seed=5)
        set_causal(chunks, objective.causal)
        batches = [objective.prepare(tokens, torch.arange(2)), objective.prepare(tokens.flip(1), torch.arange(2, 4))]
        for head in (16, 0):
            ddp[0].zero_grad_buffer()
            apex_wgrad.calls.clear()
            forward_backward(ddp, batches, head_chunk_tokens=head)
            out[(kind, head)] = (weight.main_grad.clone(), apex_wgrad.calls["wgrad_gemm_accum_fp32"])
    torch.save(out, out_path)
    destroy_parallel()


def test_the_training_step_accumulates_the_chunked_heads_weight_gradient_in_fp32(tmp_path):
    """Through megatron's schedule and DDP: the chunked head's output-weight gradient over two micro-batches equals
    megatron's fused head's within fp32 rounding (it was rounded to bf16 per micro-batch: ~2e-3 off)."""
    from mlmclm.parallel.launch import spawn

    spawn(_fused_model_worker, 1, tmp_path / "out.pt")
    r = torch.load(tmp_path / "out.pt")
    assert r["fusion"] is True
    for kind in ("clm", "mlm"):
        (chunked, chunked_calls), (whole, whole_calls) = r[(kind, 16)], r[(kind, 0)]
        gap = float((chunked - whole).norm() / whole.norm())
        assert gap <= 1e-5, (kind, gap)
        assert chunked_calls > whole_calls > 0  # every linear fused; the chunked head once per chunk
