"""The TE stand-in where it was looser or stricter than TE (issue 46, item 8), each rule read from TE's sources:

- recipes are pydantic dataclasses that ignore keyword arguments they have no field for
  (`transformer_engine/common/recipe/__init__.py`, TE 2.2 and 2.20): megatron's `get_fp8_recipe` builds every
  recipe through them, `TEDelayedScaling` passing `override_linear_precision`, `params_dtype` and `device`;
- TE 2.2-2.17 write an extra-state payload for the stateless recipes too (`module/base.py get_extra_state`, v2.17:
  the recipe and `extra_fp8_variables`), which our checkpoint guard vets and which TE >= 2.18 later ignores;
- `fuse_wgrad_accumulation=True` (megatron's `gradient_accumulation_fusion`) writes the weight gradient into
  `main_grad` (`module/linear.py _Linear.backward`, v2.2 and 2.20), so megatron's TE spec trains on CPU with the
  fusion on — every weight gradient equal to the unfused run's.
Nothing here imports megatron at module level: the spawned ranks put the stand-ins on the path first."""
import pickle

import pytest
import torch

from tests.stand_ins import transformer_engine_stand_in


@pytest.fixture
def te():
    with transformer_engine_stand_in.on_path():
        import transformer_engine

        previous = transformer_engine.__version__
        yield transformer_engine
        transformer_engine.set_version(previous)


def test_recipes_ignore_unknown_keywords_and_validate_types_as_pydantic_does(te):
    from pydantic import ValidationError
    from transformer_engine.common.recipe import DelayedScaling, Float8CurrentScaling, Format

    # What megatron-core 0.19's TEDelayedScaling hands TE's DelayedScaling (a plain dataclass raised TypeError).
    recipe = DelayedScaling(margin=0, fp8_format=Format.HYBRID, amax_compute_algo="max", amax_history_len=16,
                            override_linear_precision=(False, False, True), params_dtype=torch.bfloat16,
                            device="cpu", fp8_dpa=False, fp8_mha=False)
    assert recipe.amax_history_len == 16 and not hasattr(recipe, "params_dtype") and recipe.delayed()
    assert DelayedScaling(margin="2").margin == 2  # coerced by type
    with pytest.raises(ValidationError):
        DelayedScaling(margin="a")
    with pytest.raises(ValidationError, match="Pure E5M2 training is not supported"):  # pydantic wraps the assert
        Float8CurrentScaling(fp8_format=Format.E5M2)
    current = Float8CurrentScaling(fp8_format=Format.HYBRID, fp8_dpa=False)
    assert current.float8_current_scaling() and not current.delayed()
    assert current.fp8_gemm_fprop.use_split_accumulator is False
    assert "fp8_quant_fwd_inp" not in vars(current)  # a class attribute in TE, not a field


@pytest.mark.parametrize("recipe", ["tensorwise", "mxfp8", "blockwise"])
def test_te_2_17_writes_stateless_recipes_and_the_guard_vets_them(te, recipe):
    """TE 2.2-2.17: a payload (recipe + extra_fp8_variables) for every FP8 module; TE >= 2.18: empty. A 2.17 payload
    goes through `safe_extra_state` and back into a module; TE >= 2.18's rule ignores it (no opt-in asked)."""
    from transformer_engine.pytorch.module.base import FP8ExtraState

    from mlmclm.train.te_extra_state import safe_extra_state

    class Linear(FP8ExtraState, torch.nn.Linear):
        pass

    te.set_version("2.17.1")
    saved = Linear(2, 2)
    saved.init_fp8_meta(recipe=recipe)
    payload = saved.get_extra_state()
    assert payload.numel() > 0
    decoded = pickle.loads(payload.numpy().tobytes())
    assert set(decoded) == {"recipe", "extra_fp8_variables"} and not decoded["recipe"].delayed()
    assert decoded["extra_fp8_variables"] == {"fp8_checkpoint": True, "num_gemms": 1}
    vetted = safe_extra_state(payload, "ckpt: layer._extra_state")
    fresh = Linear(2, 2)
    fresh.set_extra_state(vetted)  # 2.17: unpickled without a gate
    assert type(fresh.fp8_meta["recipe"]) is type(saved.fp8_meta["recipe"]) and fresh.fp8_meta["fp8_checkpoint"]

    te.set_version("2.20.0")
    assert saved.get_extra_state().numel() == 0  # 2.18+: stateless recipes store nothing
    later = Linear(2, 2)
    later.set_extra_state(vetted)  # a 2.17 checkpoint resumed on 2.20: ignored, not refused
    assert not hasattr(later, "fp8_meta")


def test_linear_fuses_the_weight_gradient_into_main_grad_as_te_does(te):
    import transformer_engine.pytorch as te_pytorch

    torch.manual_seed(0)
    fused = te_pytorch.Linear(16, 8, bias=True, fuse_wgrad_accumulation=True, device="cpu")
    plain = te_pytorch.Linear(16, 8, bias=True, device="cpu")
    plain.load_state_dict(fused.state_dict())
    fused.weight.main_grad = torch.full((8, 16), 7.0)  # stale: the first micro-batch overwrites it
    fused.weight.grad_added_to_main_grad = False
    xs = [torch.randn(3, 2, 16) for _ in range(2)]
    for i, x in enumerate(xs):
        fused(x, is_first_microbatch=i == 0).sum().backward()
        plain(x, is_first_microbatch=i == 0).sum().backward()
    assert torch.allclose(fused.weight.main_grad, plain.weight.grad, atol=1e-6)
    assert fused.weight.grad_added_to_main_grad is True and fused.weight.grad.shape == (8, 16)
    assert torch.equal(fused.bias.grad, plain.bias.grad)  # the bias is not fused
    # Without an is_first_microbatch flag every micro-batch accumulates.
    fused.weight.main_grad.zero_()
    fused(xs[0]).sum().backward()
    fused(xs[1]).sum().backward()
    assert torch.allclose(fused.weight.main_grad, plain.weight.grad, atol=1e-6)
    # A shared (embedding) weight gets a zero dummy; one that DDP does not track gets None; no main_grad fails.
    fused.weight.zero_out_wgrad = True
    fused.weight.grad = None
    fused(xs[0]).sum().backward()
    assert torch.count_nonzero(fused.weight.grad) == 0
    untracked = te_pytorch.Linear(16, 8, fuse_wgrad_accumulation=True, device="cpu")
    untracked.weight.main_grad = torch.zeros(8, 16)
    untracked(xs[0]).sum().backward()
    assert untracked.weight.grad is None and untracked.weight.main_grad.abs().sum() > 0
    missing = te_pytorch.LayerNormLinear(16, 8, normalization="RMSNorm", fuse_wgrad_accumulation=True, device="cpu")
    with pytest.raises(AttributeError, match="main_grad"):
        missing(xs[0]).sum().backward()


def _stand_in_rank():
    """This rank's TE is the stand-in (on the path before megatron is imported), with apex's wgrad kernel."""
    transformer_engine_stand_in.install()
    from tests.stand_ins import apex_wgrad

    apex_wgrad.install()
    from mlmclm.model import build

    build.transformer_engine_available = lambda: (True, "the TE stand-in (tests/stand_ins/te) on CPU")


def _probe(fusion: bool):
    from mlmclm.model import fusions

    return lambda: fusions.KernelAvailability(gpu=None, apex_softmax="no CUDA", apex_wgrad=None if fusion else "off",
                                              jit_fuser="no CUDA", te_rope=fusions._te_rope_error())


def _te_spec_worker(out_path):
    _stand_in_rank()
    from megatron.core.fp8_utils import get_fp8_recipe
    from megatron.core.transformer.transformer_config import TransformerConfig

    from mlmclm.model import ModelConfig, build_model, fusions
    from mlmclm.objectives import ObjectiveConfig, build_objective
    from mlmclm.parallel import ParallelConfig, destroy_parallel, init_parallel
    from mlmclm.train.optim import OptimizerConfig, build_optimizer, wrap_ddp
    from mlmclm.train.step import configure_model_for_schedules, forward_backward

    init_parallel(ParallelConfig(), seed=3)  # the CPU emulation: megatron asks for torch.cuda.current_device()
    out = {"recipes": {}}
    for recipe in ("delayed", "tensorwise", "blockwise", "mxfp8"):  # megatron's own construction of each
        config = TransformerConfig(num_layers=1, hidden_size=64, num_attention_heads=4, fp8="hybrid",
                                   fp8_recipe=recipe)
        out["recipes"][recipe] = type(get_fp8_recipe(config)).__name__
    shape = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                        vocab_size=256, max_position_embeddings=64, make_vocab_divisible_by=8)
    objective = build_objective(ObjectiveConfig("mlm", mask_ratio=0.4), special_token_ids=[0, 1, 2, 3],
                                mask_token_id=3, vocab_size=256, seed=5)
    tokens = torch.randint(4, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    batches = [objective.prepare(tokens, torch.arange(2)), objective.prepare(tokens.flip(1), torch.arange(2, 4))]
    models = {}
    for fusion in (True, False):
        fusions.probe_kernels = _probe(fusion)
        models[fusion] = build_model(shape, ParallelConfig(), causal=False, use_te=True)
    with torch.no_grad():  # the same initial weights (each build draws from megatron's RNG tracker anew)
        for mine, theirs in zip(models[False][0].parameters(), models[True][0].parameters()):
            mine.copy_(theirs)
    for fusion, chunks in models.items():
        ddp = wrap_ddp(chunks, distributed_optimizer=False)
        configure_model_for_schedules(ddp, build_optimizer(ddp, OptimizerConfig(lr=1e-3)))
        fused = {name: getattr(module, "fuse_wgrad_accumulation", None) for name, module in chunks[0].named_modules()
                 if hasattr(module, "fuse_wgrad_accumulation")}
        stats = forward_backward(ddp, batches, head_chunk_tokens=16)
        out[fusion] = {"fused": fused, "stats": stats.clone(), "config": chunks[0].config.gradient_accumulation_fusion,
                       "grads": {name: p.main_grad.clone() for name, p in chunks[0].named_parameters()}}
    torch.save(out, out_path)
    destroy_parallel()


def test_megatrons_te_spec_trains_with_gradient_accumulation_fusion(tmp_path):
    """megatron builds each recipe through the pydantic stand-ins; its TE linears get fuse_wgrad_accumulation and
    write main_grad themselves: two micro-batches' gradients equal the unfused run's bit for bit (fp32)."""
    from mlmclm.parallel.launch import spawn

    spawn(_te_spec_worker, 1, tmp_path / "out.pt")
    r = torch.load(tmp_path / "out.pt")
    assert r["recipes"] == {"delayed": "TEDelayedScaling", "tensorwise": "Float8CurrentScaling",
                            "blockwise": "Float8BlockScaling", "mxfp8": "MXFP8BlockScaling"}
    with_fusion, without = r[True], r[False]
    assert with_fusion["config"] is True and without["config"] is False
    assert with_fusion["fused"] and all(with_fusion["fused"].values()) and not any(without["fused"].values())
    assert torch.equal(with_fusion["stats"], without["stats"])
    assert with_fusion["grads"].keys() == without["grads"].keys()
    for name, grad in with_fusion["grads"].items():
        assert torch.equal(grad, without["grads"][name]), name
        assert grad.abs().sum() > 0, name
