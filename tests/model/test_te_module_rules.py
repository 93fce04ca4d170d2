"""The TE stand-in's linears and norms (tests/stand_ins/te/transformer_engine/pytorch/module/) keep the contracts
megatron's TE wrappers rely on, as read from TE 2.20's sources: parameter names, shapes and parallel attributes, the
norm's arithmetic, and TE's refusals. Their tensor- and sequence-parallel communication is exercised against
megatron's local layers in tests/train/test_te_layer_spec_run.py (4 ranks); this file needs one process."""
import pytest
import torch

from tests.stand_ins import transformer_engine_stand_in


@pytest.fixture
def te():
    with transformer_engine_stand_in.on_path():
        import transformer_engine.pytorch as te_pytorch

        yield te_pytorch


def test_linear_shards_and_marks_its_parameters_as_te_does(te):
    column = te.Linear(64, 96, bias=True, parallel_mode="column", tp_size=2, sequence_parallel=True, device="cpu")
    assert column.weight.shape == (48, 64) and column.bias.shape == (48,)
    assert (column.weight.tensor_model_parallel, column.weight.partition_dim) == (True, 0)
    assert (column.bias.tensor_model_parallel, column.bias.partition_dim) == (True, 0)
    assert column.sequence_parallel  # TP > 1
    row = te.Linear(64, 96, bias=True, parallel_mode="row", tp_size=2, sequence_parallel=True, device="cpu")
    assert row.weight.shape == (96, 32) and row.bias.shape == (96,)
    assert (row.weight.tensor_model_parallel, row.weight.partition_dim) == (True, 1)
    assert row.bias.sequence_parallel and not hasattr(row.bias, "tensor_model_parallel")
    alone = te.Linear(64, 96, bias=False, tp_size=1, sequence_parallel=True, device="cpu")
    assert not alone.sequence_parallel and alone.bias.numel() == 0  # SP only with TP > 1; no bias: empty tensor
    assert set(dict(alone.state_dict())) == {"weight", "_extra_state"}
    with pytest.raises(AssertionError, match="parallel_mode bogus not supported"):
        te.Linear(64, 96, parallel_mode="bogus", device="cpu")
    # fuse_wgrad_accumulation (megatron's gradient_accumulation_fusion) is modelled: test_te_stand_in_contracts.py


def test_linear_refuses_what_te_refuses_at_forward(te):
    sharded = te.Linear(16, 8, parallel_mode="column", tp_size=2, device="cpu")  # no group given: set it later
    with pytest.raises(RuntimeError, match="Tensor parallel group not initialized"):
        sharded(torch.randn(3, 1, 16))
    alone = te.Linear(16, 8, bias=True, return_bias=True, device="cpu")
    with pytest.raises(TypeError, match="Data types for parameters must match"):
        alone(torch.randn(3, 1, 16, dtype=torch.bfloat16))
    x = torch.randn(3, 2, 16)
    out, bias = alone(x)  # return_bias: the bias comes back, not added
    assert out.shape == (3, 2, 8) and bias is alone.bias
    assert torch.allclose(out, x @ alone.weight.T)


def test_layernorm_linear_fuses_an_rmsnorm_marked_for_sequence_parallelism(te):
    layer = te.LayerNormLinear(16, 8, eps=1e-6, bias=False, normalization="RMSNorm", parallel_mode="column",
                               tp_size=2, sequence_parallel=True, device="cpu")
    assert list(dict(layer.named_parameters())) == ["layer_norm_weight", "weight"]
    assert layer.layer_norm_bias is None and layer.weight.shape == (4, 16)
    assert layer.layer_norm_weight.sequence_parallel  # its gradient is all-reduced over TP by megatron
    assert torch.equal(layer.layer_norm_weight, torch.ones(16))
    centered = te.LayerNormLinear(16, 8, normalization="RMSNorm", zero_centered_gamma=True, device="cpu")
    assert torch.equal(centered.layer_norm_weight, torch.zeros(16))
    x = torch.randn(5, 1, 16)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) @ centered.weight.T  # (1 + 0) · x̂
    assert torch.allclose(centered(x), expected + centered.bias, atol=1e-6)
    with pytest.raises(AssertionError, match="Unsupported normalization type"):
        te.LayerNormLinear(16, 8, normalization="ScaleNorm", device="cpu")
    with pytest.raises(NotImplementedError, match="return_layernorm_output"):
        te.LayerNormLinear(16, 8, return_layernorm_output=True, device="cpu")


def test_norm_modules_take_tes_arguments(te):
    norm = te.RMSNorm(normalized_shape=16, eps=1e-6, sequence_parallel=True, params_dtype=torch.float32,
                      zero_centered_gamma=False, device="cpu")
    assert norm.weight.sequence_parallel and set(dict(norm.state_dict())) == {"weight", "_extra_state"}
    x = torch.randn(4, 2, 16)
    assert torch.allclose(norm(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    layer_norm = te.LayerNorm(16, device="cpu")
    assert torch.allclose(layer_norm(x), torch.nn.functional.layer_norm(x, (16,), eps=1e-5), atol=1e-6)
    with pytest.raises(RuntimeError, match="Both `dtype` and `params_dtype`"):
        te.RMSNorm(16, params_dtype=torch.float32, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="not compatible"):
        norm(torch.randn(4, 8))
