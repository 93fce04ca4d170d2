"""The report over pretraining seeds on synthetic result sets (run JSONs as tools/evaluate.py writes them and a
pretraining.json as recipes/mini.py writes it): `-s<seed>` labels grouped, means and CIs against hand-computed
ones, the seed figures, bad pretraining.json, and paper-grid labels left as they were. No model is trained."""
import json

import pytest

from mlmclm.eval.reports.paper_report import SEEDS_TABLE_CSV, SEEDS_TABLE_MD, ReportInputError, write_report
from mlmclm.eval.reports.paper_report import load_results
from mlmclm.eval.reports.pretraining_runs import PRETRAINING_FILE, load_pretraining, write_pretraining
from mlmclm.eval.reports.seed_figures import CPT_PNG, CURVES_PNG, SPLIT_PNG
from mlmclm.eval.reports.seed_groups import seed_table, split_seed
from tests.eval.test_paper_report import PNG_MAGIC, hand_mean_ci, write_run

RUNS = {  # base -> (objective, total steps, CLM steps, parent objective)
    "mini-mlm40-8": ("MLM", 8, 0, None), "mini-clm-4-mlm40-8": ("biphasic", 8, 4, None),
    "mini-clm-8": ("CLM", 8, 8, None), "mini-clm-dec8-mlm40-4": ("CPT", 4, 0, "CLM"),
    "mini-mlm40-dec8-mlm40-4": ("CPT", 4, 0, "MLM")}


def pretraining_run(base: str, seed: int, offset: float) -> dict:
    objective, total, clm, parent = RUNS[base]
    steps = range(0 if objective == "CPT" else 2, total + 1, 2)
    return {"label": f"{base}-s{seed}", "base": base, "seed": seed, "objective": objective, "total_steps": total,
            "clm_steps": clm, "parent": {"label": "x", "objective": parent} if parent else None,
            "validation": [[s, 7.0 - 0.1 * s + offset, 7.5 - 0.1 * s - offset] for s in steps],
            "fill_mask": {"loss": 6.0 - offset, "top1": 0.1 + offset}}


@pytest.fixture
def seeded(tmp_path):
    """Three seeds of each run: QA scores 0.5/0.6/0.7 (+0.1 for biphasic), one fine-tuning seed each."""
    root = tmp_path / "eval"
    runs = []
    for seed, offset in zip((1, 2, 3), (0.0, 0.1, 0.2)):
        for base in RUNS:
            runs.append(pretraining_run(base, seed, offset))
            score = 0.5 + offset + (0.1 if "clm-4" in base else 0.0)
            write_run(root, f"{base}-s{seed}", "smoke_named_character", "qa", 3e-3, 0, score, score)
    write_run(root, "random-init", "smoke_named_character", "qa", 3e-3, 0, 0.3, 0.3)
    write_pretraining(root, {"baselines": {"unigram": {"loss": 6.5, "top1": 0.09}}, "runs": runs})
    return root


def test_seed_suffix_names_the_pretraining_seed():
    assert split_seed("mini-clm-400-s12") == ("mini-clm-400", 12)
    assert split_seed("610m-mlm40-42k-1000") == ("610m-mlm40-42k-1000", None)  # a checkpoint step, not a seed
    assert split_seed("610m-clm-42k") == ("610m-clm-42k", None)
    assert split_seed("random-init") == ("random-init", None)


def test_columns_are_means_and_cis_over_pretraining_seeds(seeded):
    models, _ = load_pretraining([seeded])
    table = seed_table(load_results([seeded]), models)
    assert table.runs[:5] == list(RUNS) and table.runs[5] == "random-init"
    assert table.seeds["mini-clm-8"] == [1, 2, 3] and table.seeds["random-init"] == []
    mean, ci = hand_mean_ci([0.6, 0.7, 0.8])  # the biphasic run's QA over its three seeds
    cell = table.cells[("mini-clm-4-mlm40-8", "QA")]
    assert (cell.mean, cell.ci95, cell.seeds) == (pytest.approx(mean), pytest.approx(ci), 3)
    mean, ci = hand_mean_ci([7.5 - 0.8, 7.5 - 0.8 - 0.1, 7.5 - 0.8 - 0.2])  # val MLM at the last step (8)
    assert table.cells[("mini-mlm40-8", "val MLM")].mean == pytest.approx(mean)
    assert table.cells[("mini-mlm40-8", "val MLM")].ci95 == pytest.approx(ci)
    assert table.cells[("mini-mlm40-dec8-mlm40-4", "val CLM")].mean == pytest.approx(7.0 - 0.4 + 0.1)
    assert table.cells[("random-init", "QA")].seeds == 1 and ("random-init", "val MLM") not in table.cells


def test_report_writes_the_seed_table_and_figures(seeded, tmp_path):
    out = tmp_path / "report"
    write_report([seeded], out)
    markdown = (out / SEEDS_TABLE_MD).read_text()
    mean, ci = hand_mean_ci([0.6, 0.7, 0.8])
    assert "| mini-clm-4-mlm40-8 | 3 |" in markdown and f"{100 * mean:.1f} ± {100 * ci:.1f}" in markdown
    header = (out / SEEDS_TABLE_CSV).read_text().splitlines()[0]
    assert "QA_ci95" in header and "val MLM_mean" in header and "fill-mask top-1_seeds" in header
    for name in (SPLIT_PNG, CPT_PNG, CURVES_PNG):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC, name
    report = (out / "report.md").read_text()
    assert "## Over pretraining seeds" in report and "unigram top-1 9.0 %" in report
    # 3 shares (MLM, 50 %, CLM) × 5 panels (val CLM, val MLM, fill-mask, QA, the QA task)
    assert "biphasic split × budget over pretraining seeds, 15 points" in report


def test_bad_pretraining_json_is_refused_and_nothing_written(seeded, tmp_path):
    raw = json.loads((seeded / PRETRAINING_FILE).read_text())
    raw["runs"][0]["validation"] = [[2, "x", 1.0]]
    (seeded / PRETRAINING_FILE).write_text(json.dumps(raw))
    out = tmp_path / "report"
    with pytest.raises(ReportInputError, match=r"runs\[0\].*validation\[0\]"):
        write_report([seeded], out)
    assert not out.exists()


def test_labels_without_seeds_get_no_seed_table(tmp_path):
    root = tmp_path / "eval"
    for seed in range(2):
        write_run(root, "610m-clm-42k", "squad", "qa", 1e-4, seed, 0.5, 0.5)
    out = tmp_path / "report"
    write_report([root], out)
    assert not (out / SEEDS_TABLE_MD).exists() and "pretraining seeds" not in (out / "report.md").read_text()


def test_a_mask_schedule_variant_at_the_same_split_gets_its_own_line(seeded, tmp_path):
    """recipes grid mini --mask-schedule: a second biphasic run at the 50 % split, marked as a variant; the split
    figure draws it apart (sorting two runs of one share once raised TypeError on their cells)."""
    runs = json.loads((seeded / PRETRAINING_FILE).read_text())
    for seed, offset in zip((1, 2, 3), (0.0, 0.1, 0.2)):
        run = pretraining_run("mini-clm-4-mlm40-8", seed, offset)
        run.update(label=f"mini-clm-4-mlm40to15-8-s{seed}", base="mini-clm-4-mlm40to15-8",
                   variant="mask 40% → 15% linear")
        runs["runs"].append(run)
        write_run(seeded, run["label"], "smoke_named_character", "qa", 3e-3, 0, 0.9, 0.9)
    (seeded / PRETRAINING_FILE).write_text(json.dumps(runs))
    models, _ = load_pretraining([seeded])
    assert {m.variant for m in models if m.base == "mini-clm-4-mlm40to15-8"} == {"mask 40% → 15% linear"}
    assert {m.variant for m in models if m.base == "mini-clm-4-mlm40-8"} == {None}
    out = tmp_path / "report"
    write_report([seeded], out)
    assert (out / SPLIT_PNG).read_bytes()[:8] == PNG_MAGIC
    # the three shares of the paper's design and the variant's one, × 5 panels
    assert "biphasic split × budget over pretraining seeds, 20 points" in (out / "report.md").read_text()
    runs["runs"][-1]["variant"] = 3
    (seeded / PRETRAINING_FILE).write_text(json.dumps(runs))
    with pytest.raises(ValueError, match="field 'variant' must be a string or null"):
        load_pretraining([seeded])
