"""The chunked head's weight-gradient GEMM (mlmclm/model/wgrad_gemm.py), issue 55: every path accumulates each
chunk's product in fp32 into the sum — no [vocab, hidden] product in bf16 and its fp32 copy per chunk (counted in
test_chunked_head.py) — and the head's gradients equal those of the head before it (fp32, within 1e-6), whichever path runs. The GPU paths run
here through stand-ins that enforce their contracts (TE's `general_gemm`, apex's kernel) or an emulation of torch's
`addmm(out_dtype=...)` (CUDA only); their kernels themselves are unverified until a GPU runs them."""
import pytest
import torch

from mlmclm.model import wgrad_gemm
from mlmclm.model.chunked_head import chunked_linear_cross_entropy
from tests.stand_ins import apex_wgrad, transformer_engine_stand_in

TOKENS, HIDDEN, VOCAB, CHUNK = 53, 32, 1000, 16


def _inputs(dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, HIDDEN, generator=gen).to(dtype).requires_grad_()
    weight = (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.5).to(dtype).requires_grad_()
    labels = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    token_weights = torch.rand(TOKENS, generator=gen)
    token_weights[::7] = 0
    return hidden, weight, labels, token_weights


def _todays_gradients(hidden, weight, labels, token_weights, chunk):
    """The head's gradients as it computed them before issue 55 (fp32, one rank): per chunk, the logits less
    their row max, exponentiated, scaled by token weight / sum, the label's weight taken off; the input gradient
    by mm, the weight gradient by addmm_ into the fp32 sum."""
    hidden, weight = hidden.detach(), weight.detach()
    grad_hidden, grad_weight = torch.empty_like(hidden), torch.zeros_like(weight)
    for lo in range(0, TOKENS, chunk):
        hi = min(lo + chunk, TOKENS)
        logits = hidden[lo:hi] @ weight.t()
        logits -= logits.max(dim=-1).values.unsqueeze(-1)
        logits.exp_()
        total = logits.sum(dim=-1)
        logits *= (token_weights[lo:hi] / total).unsqueeze(-1)
        logits[torch.arange(hi - lo), labels[lo:hi]] -= token_weights[lo:hi]
        grad_hidden[lo:hi] = logits @ weight
        grad_weight.addmm_(logits.t(), hidden[lo:hi])
    return grad_hidden, grad_weight


def _head_gradients():
    hidden, weight, labels, token_weights = _inputs()
    loss, _, _ = chunked_linear_cross_entropy(hidden, weight, labels, token_weights, CHUNK, None)
    loss.backward()
    return hidden.grad, weight.grad


def _assert_equals_today(got):
    today = _todays_gradients(*_inputs(), CHUNK)
    for mine, theirs in zip(got, today):
        assert (mine - theirs).abs().max() <= 1e-6 * theirs.abs().max()


def _forced(monkeypatch, path):
    monkeypatch.setattr(wgrad_gemm, "choose_path", lambda *args: path)


def test_fp32_head_equals_todays(monkeypatch):
    _assert_equals_today(_head_gradients())
    assert wgrad_gemm.last_path == wgrad_gemm.FP32


@pytest.mark.parametrize("path", [wgrad_gemm.APEX, wgrad_gemm.TE, wgrad_gemm.UPCAST])
def test_every_accumulating_path_equals_todays_head_in_fp32(monkeypatch, path):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    _forced(monkeypatch, path)
    if path == wgrad_gemm.TE:
        with transformer_engine_stand_in.on_path():
            from transformer_engine.pytorch import cpp_extensions

            cpp_extensions.calls.clear()
            got = _head_gradients()
            assert cpp_extensions.calls["NT"] == -(-TOKENS // CHUNK)  # one accumulating GEMM per chunk
    elif path == wgrad_gemm.APEX:
        with apex_wgrad.installed() as calls:
            got = _head_gradients()
            assert calls["wgrad_gemm_accum_fp32"] == -(-TOKENS // CHUNK)
    else:
        got = _head_gradients()
    assert wgrad_gemm.last_path == path
    _assert_equals_today(got)


def _torch_addmm_on_cuda(refuse: bool):
    """torch's addmm(out_dtype=float32) as its CUDA kernel behaves (it is not registered for CPU): the accumulator
    fp32 and the output itself, operands of one dtype; `refuse`: the check of torch versions that want the
    accumulator in the operands' dtype."""
    original = torch.addmm

    def addmm(self, mat1, mat2, *, out_dtype=None, out=None, **kwargs):
        if out_dtype is None:
            return original(self, mat1, mat2, out=out, **kwargs)
        if refuse:
            raise RuntimeError(f"self and mat2 must have the same dtype, but got {self.dtype} and {mat2.dtype}")
        assert out is self and out.dtype == out_dtype == torch.float32 and mat1.dtype == mat2.dtype
        return out.add_(mat1.float() @ mat2.float())
    return addmm


@pytest.mark.parametrize("refuse", [False, True])
def test_torchs_out_dtype_addmm_and_its_fallback(monkeypatch, refuse):
    """A torch whose CUDA addmm refuses an fp32 accumulator next to bf16 operands is tried once, then the upcast
    path runs for good; one that takes it runs it."""
    monkeypatch.setattr(wgrad_gemm, "_torch_dtype_addmm", None)
    monkeypatch.setattr(torch, "addmm", _torch_addmm_on_cuda(refuse))
    monkeypatch.setattr(wgrad_gemm, "te_general_gemm", lambda: None)
    choose = wgrad_gemm.choose_path
    monkeypatch.setattr(wgrad_gemm, "choose_path", lambda dtype, cuda, fused: choose(dtype, True, fused))  # "CUDA"
    inputs = torch.randn(CHUNK, HIDDEN).to(torch.bfloat16)
    grad = torch.randn(CHUNK, VOCAB).to(torch.bfloat16)
    for _ in range(2):
        out = torch.zeros(VOCAB, HIDDEN)
        path = wgrad_gemm.accumulate_wgrad(inputs, grad, out, fused=False)
        assert path == (wgrad_gemm.UPCAST if refuse else wgrad_gemm.TORCH)
        assert torch.allclose(out, grad.float().t() @ inputs.float(), rtol=1e-6, atol=1e-5)
    assert wgrad_gemm._torch_dtype_addmm is (not refuse)


def test_the_path_each_setting_takes(monkeypatch):
    bf16, fp32 = torch.bfloat16, torch.float32
    assert wgrad_gemm.choose_path(bf16, True, fused=True) == wgrad_gemm.APEX  # megatron's fusion: its kernel
    assert wgrad_gemm.choose_path(fp32, True, fused=False) == wgrad_gemm.FP32
    assert wgrad_gemm.choose_path(bf16, False, fused=False) == wgrad_gemm.UPCAST  # CPU
    with transformer_engine_stand_in.on_path():
        assert wgrad_gemm.choose_path(bf16, True, fused=False) == wgrad_gemm.TE
    monkeypatch.setattr(wgrad_gemm, "te_general_gemm", lambda: None)
    monkeypatch.setattr(wgrad_gemm, "_torch_dtype_addmm", None)
    assert wgrad_gemm.choose_path(bf16, True, fused=False) == wgrad_gemm.TORCH
    monkeypatch.setattr(wgrad_gemm, "_torch_dtype_addmm", False)
    assert wgrad_gemm.choose_path(bf16, True, fused=False) == wgrad_gemm.UPCAST
