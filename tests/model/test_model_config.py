"""Model shapes and layouts are validated on construction, each failure naming its cause."""
import pytest

from mlmclm.model import PRESETS, ModelConfig, preset
from mlmclm.parallel import ParallelConfig


def test_paper_presets_have_the_published_shapes():
    shapes = {name: (c.num_layers, c.hidden_size, c.num_attention_heads, c.num_kv_heads, c.ffn_hidden_size)
              for name, c in PRESETS.items()}
    assert shapes["eurobert-210m"] == (12, 768, 12, 12, 3072)
    assert shapes["eurobert-610m"] == (26, 1152, 18, 6, 4096)
    assert shapes["eurobert-1b"] == (28, 1728, 18, 6, 5120)
    assert shapes["eurobert-2.1b"] == (32, 2304, 18, 6, 6144)
    assert all(PRESETS[n].vocab_size == 128256 for n in ("eurobert-210m", "eurobert-610m", "eurobert-1b"))


@pytest.mark.parametrize("fields, message", [
    (dict(num_attention_heads=12, num_kv_heads=5), "not divisible by num_kv_heads"),
    (dict(hidden_size=100, num_attention_heads=12), "hidden_size 100 is not divisible"),
    (dict(num_layers=0), "num_layers must be a positive"),
    (dict(rope_theta=0.0), "rope_theta"),
])
def test_invalid_shapes_are_refused(fields, message):
    base = dict(num_layers=2, hidden_size=96, num_attention_heads=12, num_kv_heads=4, ffn_hidden_size=64)
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{**base, **fields})


@pytest.mark.parametrize("layout, message", [
    (ParallelConfig(tensor_parallel=9), "num_kv_heads 6 is not divisible by tensor_parallel 9"),
    (ParallelConfig(tensor_parallel=12), "num_attention_heads 18 is not divisible by tensor_parallel 12"),
    (ParallelConfig(pipeline_parallel=3), "num_layers 26 is not divisible by pipeline_parallel"),
    (ParallelConfig(pipeline_parallel=2, virtual_pipeline_parallel=2), r"pipeline_parallel × virtual"),
])
def test_layouts_that_cannot_split_the_610m_shape_are_refused(layout, message):
    with pytest.raises(ValueError, match=message):
        preset("eurobert-610m").validate_layout(layout)


def test_valid_layout_passes_and_vocab_is_padded_for_tp():
    cfg = preset("eurobert-610m")
    cfg.validate_layout(ParallelConfig(tensor_parallel=2, pipeline_parallel=2))
    padded = cfg.padded_vocab_size(4)
    assert padded >= cfg.vocab_size and padded % (cfg.make_vocab_divisible_by * 4) == 0
    assert padded - cfg.vocab_size < cfg.make_vocab_divisible_by * 4


@pytest.mark.parametrize("kwargs, message", [
    (dict(sequence_parallel=True), "sequence_parallel needs tensor_parallel > 1"),
    (dict(virtual_pipeline_parallel=2), "needs pipeline_parallel > 1"),
    (dict(tensor_parallel=0), "tensor_parallel must be >= 1"),
])
def test_invalid_parallel_configs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ParallelConfig(**kwargs)


def test_world_size_must_divide_by_model_parallel_size():
    with pytest.raises(ValueError, match="world size 6 is not divisible by TP×PP×CP"):
        ParallelConfig(tensor_parallel=4).data_parallel_size(6)


def test_unknown_preset_and_override_are_named():
    with pytest.raises(ValueError, match="unknown model preset 'eurobert-9b'"):
        preset("eurobert-9b")
    with pytest.raises(ValueError, match="unknown model field"):
        preset("tiny", num_experts=8)


def test_context_parallel_is_refused_before_any_process_group_with_what_is_missing():
    with pytest.raises(ValueError) as err:
        ParallelConfig(tensor_parallel=2, context_parallel=2)
    message = str(err.value)
    assert message.startswith("parallel.context_parallel=2 is not supported")
    for missing in ("get_batch_on_this_cp_rank", "loss, token counts and accuracy", "pipeline-parallel buffers",
                    "silently wrong", "Use context_parallel=1"):
        assert missing in message
    ParallelConfig(context_parallel=1)  # the default stays valid


def test_context_parallel_in_a_training_config_is_refused_when_the_config_is_read():
    from mlmclm.config_io import apply_overrides
    from mlmclm.train.config import TrainConfig

    data = {"model": "tiny-test", "run_dir": "/nonexistent/run", "data": {"path": "/nonexistent"}, "phases": [{"objective": {"kind": "mlm"}, "steps": 4}],
            "total_steps": 4, "global_batch_size": 4}
    TrainConfig.from_dict(data)  # valid as it is
    with pytest.raises(ValueError, match="context_parallel=4 is not supported"):
        TrainConfig.from_dict(apply_overrides(data, ["parallel.context_parallel=4"]))
