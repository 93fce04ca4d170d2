"""The peak-memory estimate (mlmclm/model/memory.py): its terms as its docstring states them, and the plan's
refusal of a layout whose worst-case micro-batch does not fit an 80 GB H100."""
import pytest

from mlmclm.model import ModelConfig, preset
from mlmclm.model.memory import (GIB, H100_80GB_BYTES, OVERHEAD_BYTES, RankLayout, chunked_logits_bytes,
                                 estimate_peak_memory, logits_bytes, parameters_per_rank)

SMALL = ModelConfig(num_layers=4, hidden_size=64, num_attention_heads=4, num_kv_heads=2, ffn_hidden_size=96,
                    vocab_size=1000, max_position_embeddings=64)


def test_the_terms_follow_the_stated_formula():
    h, kv, f, v = 64, 2 * 16, 96, 1000
    layer = h * (h + 2 * kv) + h * h + 3 * h * f + 2 * h
    assert parameters_per_rank(SMALL, RankLayout()) == 4 * layer + 2 * v * h + h
    assert parameters_per_rank(SMALL, RankLayout(tensor_parallel=2, pipeline_parallel=2)) == \
        2 * layer // 2 + v * h // 2 + h
    layout = RankLayout(data_parallel=8, micro_batches_per_step=4)
    est = estimate_peak_memory(SMALL, layout, tokens=100, predicted_fraction=0.5)
    params = parameters_per_rank(SMALL, layout)
    assert est.model_states == int(params * (2 + 4 + 12 / 8))
    assert est.activations == int(100 * 4 * 2 * (4 * h + 3 * h + 2 * kv + 3 * f))
    assert est.logits == 50 * v * 6 and est.overhead == OVERHEAD_BYTES
    assert est.total == est.model_states + est.activations + est.logits + est.overhead
    # TP with sequence parallelism divides every activation term; pipeline stages hold min(PP, micro-batches)
    sp = estimate_peak_memory(SMALL, RankLayout(tensor_parallel=2, sequence_parallel=True), tokens=100)
    assert sp.activations == int(100 * 4 * 2 * (4 * h + 3 * h + 2 * kv + 3 * f) / 2)
    pp = estimate_peak_memory(SMALL, RankLayout(pipeline_parallel=2, micro_batches_per_step=4), tokens=100)
    assert pp.activations == int(100 * 2 * 2 * 2 * (4 * h + 3 * h + 2 * kv + 3 * f))


def test_the_clm_logits_at_the_tail_are_what_the_issue_measured():
    # 22.5k tokens of 128,256-entry logits: 5.8 GB in bf16, plus megatron's fp32 cross-entropy copy.
    assert logits_bytes(22_500, 128_256, 1) == 22_500 * 128_256 * 6
    assert 22_500 * 128_256 * 2 / 1e9 == pytest.approx(5.77, abs=0.01)
    assert logits_bytes(22_500, 128_256, 2) == logits_bytes(22_500, 128_256, 1) // 2
    # The chunked head (mlmclm.model.chunked_head): one chunk's fp32 logits and their bf16 copy, the fp32 weight
    # gradient and the bf16 hidden-state gradient held from forward to backward, with their transient copies.
    assert chunked_logits_bytes(22_500, 128_256, 1, 256, 2048) == \
        256 * 128_256 * 6 + 128_256 * 2048 * 10 + 22_500 * 2048 * 4
    assert chunked_logits_bytes(10, 128_256, 2, 256, 2048) == 10 * 64_128 * 6 + 64_128 * 2048 * 10 + 10 * 2048 * 4
    est = estimate_peak_memory(SMALL, RankLayout(), tokens=100, head_chunk_tokens=16)
    assert est.logits == chunked_logits_bytes(100, 1000, 1, 16, 64)


def test_worst_case_is_what_refuses_a_layout(tmp_path):
    """2.1b at 12 samples per forward with megatron's whole head: fits at the mean micro-batch, not at the worst;
    the plan refuses it. The chunked head makes it fit; 16 samples per forward do not, even chunked."""
    from mlmclm.data.random_length import SampleLengths
    from mlmclm.objectives import ObjectiveConfig
    from mlmclm.train.config import DataConfig, PhaseConfig, TrainConfig
    from recipes.sweep import memory_plan

    def config(model, micro=12, chunk=0):
        return TrainConfig(run_dir=str(tmp_path / model), model=preset(model), total_steps=10, head_chunk_tokens=chunk,
                           global_batch_size=micro * 192, micro_batch_size=micro,
                           data=DataConfig(path=str(tmp_path), random_length=SampleLengths(12, 2048)),
                           phases=[PhaseConfig(ObjectiveConfig("clm"), fraction=1.0)])

    fits = memory_plan(config("eurobert-1b"), world=192, seq_length=2048)
    assert fits.worst.total <= H100_80GB_BYTES and fits.worst.tokens == 24_576
    big = config("eurobert-2.1b")
    with pytest.raises(ValueError, match=r"layout tp1 pp1 dp192 does not fit an 79\.6 GiB GPU at the worst-case "
                                         r"micro-batch: .* at 24,576 tokens .*mean case"):
        memory_plan(big, world=192, seq_length=2048)
    half = memory_plan(config("eurobert-2.1b", micro=6), world=192, seq_length=2048)
    assert half.worst.total <= H100_80GB_BYTES < estimate_peak_memory(
        preset("eurobert-2.1b"), RankLayout(data_parallel=192), 24_576).total
    assert memory_plan(config("eurobert-2.1b", chunk=256), world=192, seq_length=2048).worst.total <= H100_80GB_BYTES
    with pytest.raises(ValueError, match="at 32,768 tokens"):
        memory_plan(config("eurobert-2.1b", micro=16, chunk=256), world=192, seq_length=2048)
    assert GIB == 2**30


def test_the_plan_counts_a_long_context_phase_at_its_own_length(tmp_path):
    """A short-row phase, then a phase of its own rows at an 8,192-token context: the worst case is the long
    phase's (its rows are at most its context), not the run data's rows."""
    from mlmclm.objectives import ObjectiveConfig
    from mlmclm.train.config import DataConfig, PhaseConfig, TrainConfig
    from recipes.sweep import memory_plan

    phases = [PhaseConfig(ObjectiveConfig("clm"), steps=8),
              PhaseConfig(ObjectiveConfig("mlm"), steps=2, rope_theta=160_000.0, max_position_embeddings=8192,
                          data=DataConfig(path=str(tmp_path / "long")))]
    cfg = TrainConfig(run_dir=str(tmp_path / "run"), model=preset("eurobert-210m"), total_steps=10,
                      global_batch_size=4 * 8, micro_batch_size=4, data=DataConfig(path=str(tmp_path / "short")),
                      phases=phases)
    plan = memory_plan(cfg, world=8, seq_length=1024)
    assert plan.worst.tokens == plan.mean.tokens == 4 * 8192
    short_only = memory_plan(TrainConfig(run_dir=str(tmp_path / "run"), model=preset("eurobert-210m"), total_steps=10,
                                         global_batch_size=32, micro_batch_size=4,
                                         data=DataConfig(path=str(tmp_path / "short")),
                                         phases=[PhaseConfig(ObjectiveConfig("clm"), steps=10)]), world=8,
                             seq_length=1024)
    assert short_only.worst.tokens == 4 * 1024 and short_only.worst.total < plan.worst.total
