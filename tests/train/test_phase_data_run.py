"""Per-phase data in a real run (megatron-core over gloo): CLM on the 64-token rows, a long-context MLM phase on
rows prepared at 128 tokens with RoPE θ and the context raised, then MLM on the 64-token rows again. Each phase reads
its own data, the first dataset reads on where its phase left off (no sample read twice, none skipped), and a run
stopped and resumed across the switch back is bit-identical to the uninterrupted one."""
import json
import shutil

import pytest

import train_scenarios as sc
from mlmclm.data.prepare import prepare_embedded_corpus
from mlmclm.parallel.launch import spawn
from mlmclm.train import checkpoint as ckpt

LONG_ROWS = 2 * sc.SEQ
STEPS = (4, 3, 3)  # short rows (CLM), long rows (MLM), short rows again (MLM)


def config(run_dir, short, long):
    # the model is built for the short rows' context; the long phase raises it to its rows' length
    return sc.config(run_dir, short, model={"preset": "tiny", "max_position_embeddings": sc.SEQ}, phases=[
        {"objective": {"kind": "clm"}, "steps": STEPS[0]},
        {"objective": {"kind": "mlm", "mask_ratio": 0.3}, "steps": STEPS[1], "name": "mlm_long",
         "rope_theta": 40_000.0, "max_position_embeddings": LONG_ROWS,
         "data": {"path": str(long), "tokenizer": "embedded"}},
        {"objective": {"kind": "mlm", "mask_ratio": 0.3}, "steps": STEPS[2]}])


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data):
    """The uninterrupted run; one stopped after step 8 (its last save, 7, ends the long phase) then resumed; a
    copy of the stopped run resumed with the long phase's data moved (allowed: only its location changed)."""
    root = tmp_path_factory.mktemp("phase_data")
    long = root / "long_rows"
    prepare_embedded_corpus(long, seq_length=LONG_ROWS, max_tokens=60_000)
    whole, resumed, moved = root / "whole", root / "resumed", root / "moved"
    spawn(sc.run_until, 1, config(resumed, data, long), 8)
    assert ckpt.latest_checkpoint(resumed / "checkpoints").name == "iter_0000007"
    shutil.copytree(resumed, moved)
    shutil.copytree(long, root / "long_rows_moved")
    spawn(sc.run_each_reporting_errors, 1, [config(whole, data, long), config(resumed, data, long),
                                            config(moved, data, root / "long_rows_moved")], root / "report.json")
    return whole, resumed, moved, json.loads((root / "report.json").read_text())


def test_each_phase_reads_its_own_rows_at_its_own_theta(runs):
    whole, _, _, report = runs
    assert report[0]["status"] == "completed", report[0]
    metrics = sc.metrics_rows(whole)
    lengths = [metrics[s]["train/context_length"] for s in range(1, sc.TOTAL + 1)]
    assert lengths == [sc.SEQ] * STEPS[0] + [LONG_ROWS] * STEPS[1] + [sc.SEQ] * STEPS[2]
    thetas = [metrics[s]["train/rope_theta"] for s in range(1, sc.TOTAL + 1)]
    assert thetas == [10_000.0] * STEPS[0] + [40_000.0] * (STEPS[1] + STEPS[2])   # θ never falls back
    # tokens per step: 8 rows of the phase's length
    assert [metrics[s]["train/tokens"] - metrics.get(s - 1, {}).get("train/tokens", 0)
            for s in range(1, sc.TOTAL + 1)] == [8 * n for n in lengths]


def test_the_first_dataset_reads_on_where_its_phase_left_off(runs):
    whole, _, _, _ = runs
    after_long = ckpt.read_json(whole / "checkpoints" / "iter_0000007", ckpt.TRAIN_STATE)
    short, long = after_long["loaders"]
    assert (short["consumed_samples"], long["consumed_samples"]) == (8 * STEPS[0], 8 * STEPS[1])
    final = ckpt.read_json(whole / "checkpoints" / f"iter_{sc.TOTAL:07d}", ckpt.TRAIN_STATE)
    short, long = final["loaders"]
    # had the third phase started the dataset again, it would have consumed 8 * STEPS[2] samples, not these
    assert (short["consumed_samples"], long["consumed_samples"]) == (8 * (STEPS[0] + STEPS[2]), 8 * STEPS[1])
    assert final["consumed_samples"] == 8 * sc.TOTAL
    assert (final["rope_theta"], final["max_position_embeddings"]) == (40_000.0, LONG_ROWS)


def test_a_resume_across_the_data_switch_is_bit_identical(runs):
    whole, resumed, moved, report = runs
    assert report[1]["status"] == "completed" and report[2]["status"] == "completed", report
    ref = sc.metrics_rows(whole)
    for run in (resumed, moved):
        again = sc.metrics_rows(run)
        for step in range(1, sc.TOTAL + 1):
            loss = f"train/{ref[step]['phase']}/loss"
            assert again[step][loss] == ref[step][loss], (run.name, step)
