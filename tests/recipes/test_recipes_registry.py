"""Every registered recipe builds, validates, serialises; batch sizing; generated table is current."""
import fiddle as fdl
import nemo_run as run
import pytest
from nemo_run.core.serialization.zlib_json import ZlibJSONSerializer

from recipes import registry
from recipes.base import PAPER_GLOBAL_BATCH, micro_batch_for, validate, world_size
from recipes.entry import pretrain_entry

README = registry.README


@pytest.mark.parametrize("name", sorted(registry.RECIPES))
def test_recipe_builds_validates_and_serialises(name):
    recipe = registry.RECIPES[name]
    partial = recipe.build(**recipe.example)
    cfg = validate(partial)
    dp = cfg.parallel.data_parallel_size(world_size(partial))
    assert cfg.micro_batch_size * cfg.num_microbatches(dp) * dp == cfg.global_batch_size
    cfg.model.validate_layout(cfg.parallel)
    serializer = ZlibJSONSerializer()
    restored = serializer.deserialize(serializer.serialize(partial))
    assert fdl.get_callable(restored) is pretrain_entry
    assert fdl.build(restored.config).to_dict() == cfg.to_dict()
    assert (restored.nodes, restored.gpus_per_node) == (partial.nodes, partial.gpus_per_node)


@pytest.mark.parametrize("name", ["mlm_610m", "tiny_clm_mlm"])
def test_recipes_are_nemo_run_factories(name):
    factory = run.cli.resolve_factory(pretrain_entry, name)
    partial = factory(**registry.RECIPES[name].example)
    assert fdl.build(partial.config).to_dict() == validate(registry.get(name).build()).to_dict()


@pytest.mark.parametrize("nodes", [1, 2, 3, 4, 6, 8, 12, 24, 36])
def test_global_batch_in_tokens_is_fixed_across_node_counts(nodes):
    partial = registry.get("clm_mlm_1b").build(nodes=nodes)
    cfg = validate(partial)
    dp = nodes * 8  # TP=PP=CP=1 for this size
    assert cfg.global_batch_size == PAPER_GLOBAL_BATCH
    assert cfg.micro_batch_size <= 12 and cfg.micro_batch_size * cfg.num_microbatches(dp) * dp == 2304


def test_four_node_610m_accumulates_six_micro_batches_of_twelve_random_length_samples():
    # The paper's 12 samples per GPU forward (12 × 1030 tokens on average: base.SIZES' budget of 12 × 1024);
    # fixed 2048-token rows halve the micro batch.
    cfg = validate(registry.get("clm_mlm_610m").build(nodes=4))
    assert (cfg.micro_batch_size, cfg.num_microbatches(32)) == (12, 6)
    lengths = cfg.data.random_length
    assert (lengths.min_length, lengths.max_length) == (12, 2048) and not cfg.per_document_attention
    assert cfg.model.max_position_embeddings == 2048 and cfg.data.path.endswith("-2048")
    rows = validate(registry.get("clm_mlm_610m").build(nodes=4, fixed_rows=True))
    assert rows.data.random_length is None and (rows.micro_batch_size, rows.num_microbatches(32)) == (6, 12)


def test_micro_batch_choice_and_indivisible_node_count():
    assert micro_batch_for(2304, 72, 12) == 8  # 32 per rank: 12 does not divide it, 8 is the largest that does
    with pytest.raises(ValueError, match="cannot be split evenly over 40"):
        registry.get("mlm_210m").build(nodes=5)


def test_switch_must_come_before_the_wsd_decay():
    # 95 % CLM of 12k steps leaves a 600-step MLM phase, shorter than the 2k decay.
    with pytest.raises(ValueError, match="before the WSD decay"):
        registry.get("clm_mlm_610m").build(clm_share=0.95, total_steps=12_000)
    with pytest.raises(ValueError, match="before the WSD decay"):
        registry.get("clm_mlm_610m").build(clm_steps=40_001)


@pytest.mark.parametrize("total, shares_to_steps", [
    (12_000, [3_000, 6_000, 9_000]), (22_000, [5_000, 11_000, 17_000]), (42_000, [10_000, 21_000, 32_000])])
def test_biphasic_clm_steps_are_the_papers_whole_thousands(total, shares_to_steps):
    # round(share × total) would give 5 500 / 16 500 at 22k and 10 500 / 31 500 at 42k
    for share, steps in zip((0.25, 0.5, 0.75), shares_to_steps):
        by_share = validate(registry.get("clm_mlm_610m").build(clm_share=share, total_steps=total))
        by_steps = validate(registry.get("clm_mlm_610m").build(clm_steps=steps, total_steps=total))
        assert by_share.phase_steps() == by_steps.phase_steps() == [steps, total - steps]
        assert by_share.run_dir.endswith(f"/610m-clm-{steps // 1000}k-mlm40-{total // 1000}k")
    with pytest.raises(ValueError, match="not both"):
        registry.get("clm_mlm_610m").build(clm_steps=3_000, clm_share=0.25)


def test_bad_inputs_have_clear_errors():
    with pytest.raises(ValueError, match="unknown recipe"):
        registry.get("mlm_7b")
    with pytest.raises(ValueError, match="unknown parameter"):
        registry.get("mlm_210m").build(mask_rate=0.3)
    with pytest.raises(ValueError, match="cpt needs init_from"):
        registry.get("cpt_210m").build()
    with pytest.raises(ValueError, match="mask_ratio"):
        registry.get("mlm_210m").build(mask_ratio=1.5)
    with pytest.raises(ValueError, match="clm_steps must be between"):
        registry.get("clm_mlm_610m").build(clm_steps=42_000)


def test_paper_defaults_reach_the_config():
    cfg = validate(registry.get("mlm_1b").build())
    assert (cfg.optimizer.beta1, cfg.optimizer.beta2, cfg.optimizer.eps) == (0.9, 0.95, 1e-5)
    assert (cfg.optimizer.weight_decay, cfg.optimizer.clip_grad, cfg.optimizer.lr) == (0.1, 1.0, 5e-4)
    assert (cfg.schedule.style, cfg.schedule.warmup_steps, cfg.schedule.decay_steps) == ("wsd", 2000, 2000)
    assert (cfg.total_steps, cfg.model.vocab_size, cfg.model.rope_theta) == (42_000, 128256, 10_000.0)
    assert cfg.model.max_position_embeddings == 2048 and cfg.run_dir == "/checkpoints/mlmclm/1b-mlm40-42k"
    assert cfg.phases[0].objective.mask_mode == "mask_only" and cfg.phases[0].objective.mask_ratio == 0.4
    assert cfg.precision.fp8 == "hybrid" and cfg.precision.fp8_attention == "auto"


def test_readme_table_is_generated_from_the_registry():
    assert registry.readme_table(README.read_text()) == registry.markdown_table(), (
        "recipes/README.md is stale: regenerate its table with `python -m recipes --update-readme`")


def test_readme_writer_replaces_only_the_table(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{registry.TABLE_START}\n| old |\n{registry.TABLE_END}\noutro\n")
    registry.write_readme_table(readme)
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "| old |" not in text
    assert registry.readme_table(text) == registry.markdown_table()


@pytest.mark.parametrize("name", ["tiny_clm_mlm", "cpt_610m"])
def test_a_recipes_help_lists_its_parameters_with_types_and_defaults(name):
    """`python -m recipes NAME --help`, as typed; every parameter the builder takes, with its type and default."""
    import subprocess
    import sys
    from pathlib import Path

    proc = subprocess.run([sys.executable, "-m", "recipes", name, "--help"], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = {line.split()[0]: line.split(None, 1)[1] for line in proc.stdout.splitlines() if line.startswith("  ")}
    recipe = registry.get(name)
    assert list(lines) == list(recipe.parameters()), proc.stdout
    assert lines["steps"] == f"int, default {recipe.parameters()['steps']}"
    assert lines["run_dir"] == "str | None, default None"
    if recipe.fixed:
        assert "Fixed by the name: size='610m'" in proc.stdout
