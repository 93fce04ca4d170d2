"""The paper report on synthetic result sets written exactly as tools/evaluate.py writes them (run_path +
write_json_atomic of a RunRecord): table values against hand-computed means and CIs, the figures, bad inputs and
the no-overwrite rule. No model is trained."""
import csv
import importlib.util
import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest

from mlmclm.eval.finetune.protocol import RunRecord, run_path, write_json_atomic
from mlmclm.eval.reports.paper_figures import biphasic_point, checkpoint_of, stability_figure
from mlmclm.eval.reports.paper_reference import PAPER_SCORES, ReferenceScore, reference_lookup
from mlmclm.eval.reports.paper_report import ReportInputError, load_results, main_table, write_report
from recipes.grid import paper_catalogue

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
T_975_DF2 = 4.302652729911275  # Student t quantile 0.975 with 2 degrees of freedom (3 seeds)
METRIC = {"classification": "accuracy", "token_classification": "f1", "qa": "f1", "retrieval": "ndcg@10"}
TOOL = Path(__file__).resolve().parents[2] / "tools" / "paper_report.py"


def write_run(root: Path, model: str, task: str, family: str, lr: float, seed: int, validation: float,
              test: float, rules: str | None = "encodeval") -> Path:
    """A run record; `rules` "encodeval" as `--suite paper` writes them (None: a standard run, no extra.rules)."""
    metric = METRIC[family]
    record = RunRecord(model=model, task=task, family=family, main_metric=metric, learning_rate=lr, seed=seed,
                       validation={metric: validation}, test={metric: test}, diverged=False, steps=10,
                       train_loss_first=1.0, train_loss_last=0.5, fingerprint="synthetic",
                       extra={"rules": rules} if rules else {})
    path = run_path(root, model, task, lr, seed)
    write_json_atomic(path, asdict(record))
    return path


def write_model(root: Path, model: str, tasks: dict[str, str], base: float = 0.5) -> None:
    """Two LRs x three seeds per task; LR 1e-4 always wins on validation."""
    for index, (task, family) in enumerate(tasks.items()):
        for lr, offset in ((1e-4, 0.1), (5e-4, 0.0)):
            for seed in range(3):
                score = base + offset + 0.01 * index + 0.02 * seed
                write_run(root, model, task, family, lr, seed, validation=score, test=score - 0.05)


@pytest.fixture
def hand_case(tmp_path) -> Path:
    """Model m: two SC tasks. t1's validation picks LR 2e-4, t2's picks 1e-4 (test scores of the losing LR are
    higher, so a selection on test would show). Model other: one QA task only."""
    root = tmp_path / "eval"
    t1 = {1e-4: ([0.50, 0.50, 0.50], [0.99, 0.99, 0.99]), 2e-4: ([0.70, 0.70, 0.70], [0.80, 0.82, 0.84])}
    t2 = {1e-4: ([0.60, 0.60, 0.60], [0.60, 0.70, 0.65]), 2e-4: ([0.40, 0.40, 0.40], [0.95, 0.95, 0.95])}
    for task, grid in (("t1", t1), ("t2", t2)):
        for lr, (validation, test) in grid.items():
            for seed in range(3):
                write_run(root, "m", task, "classification", lr, seed, validation[seed], test[seed])
    for seed, score in enumerate([0.4, 0.5, 0.6]):
        write_run(root, "other", "squad", "qa", 1e-4, seed, score, score)
    return root


def hand_mean_ci(values):
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    return mean, T_975_DF2 * sd / math.sqrt(len(values))


def test_main_table_matches_hand_computed_means_and_cis(hand_case):
    table = main_table(load_results([hand_case]))
    assert table.models == ["m", "other"] and table.families == ["SC", "QA"] and table.tasks == ["t1", "t2", "squad"]
    t1_mean, t1_ci = hand_mean_ci([0.80, 0.82, 0.84])  # 0.82 ± 4.3027 * 0.02 / sqrt(3)
    assert table.cells[("m", "t1")].mean == pytest.approx(0.82)
    assert table.cells[("m", "t1")].ci95 == pytest.approx(t1_ci) == pytest.approx(0.049683, abs=1e-6)
    # family: per seed the mean of t1 and t2 at their chosen LRs = 0.70, 0.76, 0.745; then mean ± CI over seeds
    sc_mean, sc_ci = hand_mean_ci([0.70, 0.76, 0.745])
    assert table.cells[("m", "SC")].mean == pytest.approx(0.735) == pytest.approx(sc_mean)
    assert table.cells[("m", "SC")].ci95 == pytest.approx(sc_ci) == pytest.approx(0.077567, abs=1e-6)
    assert ("m", "QA") not in table.cells and ("other", "SC") not in table.cells


def test_report_files_carry_the_table(hand_case, tmp_path):
    out = tmp_path / "report"
    write_report([hand_case], out)
    markdown = (out / "main_table.md").read_text()
    assert "| model | SC | QA | t1 | t2 | squad |" in markdown
    assert "| m | 73.5 ± 7.8 | — | 82.0 ± 5.0 | 65.0 ± 12.4 | — |" in markdown
    rows = {row["model"]: row for row in csv.DictReader((out / "main_table.csv").open())}
    assert float(rows["m"]["SC_mean"]) == pytest.approx(0.735)
    assert float(rows["m"]["SC_ci95"]) == pytest.approx(hand_mean_ci([0.70, 0.76, 0.745])[1])
    assert rows["m"]["QA_mean"] == "" and float(rows["other"]["squad_mean"]) == pytest.approx(0.5)
    report = (out / "report.md").read_text()
    assert "No distance from the paper" in report and "stability.png" in report


def test_distance_from_the_paper_where_a_reference_exists(hand_case, tmp_path):
    reference = (ReferenceScore("m", "SC", 70.0, "synthetic"), ReferenceScore("other", "squad", 52.0, "synthetic"))
    table = main_table(load_results([hand_case]), reference)
    assert table.cells[("m", "SC")].distance == pytest.approx(3.5)
    assert table.cells[("other", "squad")].distance == pytest.approx(-2.0)
    assert table.cells[("m", "t1")].distance is None
    out = tmp_path / "report"
    write_report([hand_case], out, reference=reference)
    assert "+3.5 (paper 70.0)" in (out / "main_table.md").read_text()
    rows = {row["model"]: row for row in csv.DictReader((out / "main_table.csv").open())}
    assert float(rows["m"]["SC_distance_pp"]) == pytest.approx(3.5) and rows["m"]["t1_paper"] == ""


def test_only_runs_under_encodevals_rules_are_compared_with_the_paper(tmp_path):
    # the paper's numbers and released results are EncodEval's scores (its QA token F1, its nDCG over the retrieved
    # ten): a standard run (SQuAD span F1, full nDCG@10) is another quantity and gets no distance
    ours = tmp_path / "eval"
    for seed, score in enumerate([0.80, 0.82, 0.84]):
        write_run(ours, "paper", "squad", "qa", 1e-4, seed, score, score)
        write_run(ours, "old", "squad", "qa", 1e-4, seed, score, score, rules=None)
    reference = (ReferenceScore("paper", "squad", 80.0, "synthetic"), ReferenceScore("old", "squad", 80.0, "x"),
                 ReferenceScore("old", "QA", 80.0, "x"))
    table = main_table(load_results([ours]), reference)
    assert table.cells[("paper", "squad")].distance == pytest.approx(2.0)
    assert table.cells[("old", "squad")].distance is None and table.cells[("old", "QA")].distance is None
    assert table.not_comparable == [("old", "squad"), ("old", "QA")]
    write_report([ours], tmp_path / "report", reference=reference)
    assert "No distance for 2 cell(s) with a reference score (old/squad, old/QA): their runs were not scored " \
           "under EncodEval's rules" in (tmp_path / "report" / "report.md").read_text()


def test_recorded_reference_is_consistent():
    reference_lookup(PAPER_SCORES)  # no (model, column) twice, values in percent
    with pytest.raises(ValueError, match="percent"):
        ReferenceScore("m", "SC", 173.5, "not percent")


def test_paper_names_come_from_the_grid():
    grid = paper_catalogue()
    assert biphasic_point("610m-clm-10k-mlm40-42k", grid) == (42_000, pytest.approx(100 * 10 / 42))
    assert biphasic_point("610m-mlm40-12k", grid) == (12_000, 0.0)
    assert biphasic_point("610m-clm-22k", grid) == (22_000, 100.0)
    for outside in ("610m-clm-40k-mlm40-42k", "610m-mlm20-42k", "210m-mlm40-42k", "610m-clm-dec42k-mlm40-44k",
                    "my-model"):
        assert biphasic_point(outside, grid) is None, outside
    run, step = checkpoint_of("610m-mlm40-42k-1000", grid)
    assert (run.name, run.objective, step) == ("610m-mlm40-42k", "MLM", 1000)
    assert checkpoint_of("610m-clm-42k", grid)[1] == 42_000 and checkpoint_of("610m-mlm40-42k-x", grid) is None


def test_figures_from_a_synthetic_paper_grid(tmp_path):
    root = tmp_path / "eval"
    tasks = {"sst2": "classification", "conll2003": "token_classification", "squad": "qa", "msmarco": "retrieval"}
    names = ["610m-mlm40-12k", "610m-clm-3k-mlm40-12k", "610m-clm-12k", "610m-mlm40-42k", "610m-clm-21k-mlm40-42k",
             "610m-clm-42k", "610m-mlm40-42k-1000", "610m-clm-42k-1000"]
    for index, name in enumerate(names):
        write_model(root, name, tasks, base=0.4 + 0.02 * index)
    out = tmp_path / "report"
    write_report([root], out, grid=paper_catalogue())
    for name in ("biphasic.png", "data_efficiency.png", "stability.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC, name
    report = (out / "report.md").read_text()
    assert "biphasic split × budget, 24 (model, family) points" in report  # 6 split runs x 4 families
    assert "score vs pretraining steps, 8 lines" in report  # MLM and CLM lines (1k -> 42k) in 4 families


def test_stability_draws_one_box_per_task(tmp_path):
    root = tmp_path / "eval"
    tasks = {"sst2": "classification", "mnli": "classification", "squad": "qa"}
    write_model(root, "a", tasks)
    write_model(root, "b", {"sst2": "classification"})
    boxed = stability_figure(load_results([root]), tmp_path / "stability.png")
    assert boxed == {"a": ["mnli", "sst2", "squad"], "b": ["sst2"]}
    assert (tmp_path / "stability.png").read_bytes()[:8] == PNG_MAGIC


def test_data_efficiency_from_curve_json_and_skipped_without_checkpoints(tmp_path):
    root = tmp_path / "610m-clm-42k"
    write_model(root, "610m-clm-42k", {"sst2": "classification"})
    out = tmp_path / "no_curve"
    write_report([root], out, grid=paper_catalogue())
    assert not (out / "data_efficiency.png").exists()
    assert (out / "biphasic.png").exists()  # 610m-clm-42k is the 100 % CLM end of the 42k budget
    assert "not drawn: no run has checkpoints" in (out / "report.md").read_text()
    write_json_atomic(root / "curve.json", {"points": [
        {"iteration": step, "family_scores": {"classification": score}} for step, score in ((100, 0.5), (200, 0.6))]})
    out = tmp_path / "curve"
    write_report([root], out, grid=paper_catalogue())
    assert (out / "data_efficiency.png").read_bytes()[:8] == PNG_MAGIC


def run_tool(args, capsys) -> tuple[int, str]:
    spec = importlib.util.spec_from_file_location("paper_report_tool", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    code = tool.main([str(a) for a in args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("damage, expected", [
    (lambda raw: raw.pop("test"), "field 'test' is missing"),
    (lambda raw: raw.update(test={"other": 0.5}), "field 'test' has no number for the main metric 'accuracy'"),
    (lambda raw: raw.update(family="sentiment"), "field 'family' is 'sentiment'"),
    (lambda raw: raw.update(seed="0"), "field 'seed' has type str"),
    (lambda raw: raw.update(model="elsewhere"), "disagree with the path"),
])
def test_malformed_run_json_exits_2_naming_path_and_field(hand_case, tmp_path, capsys, damage, expected):
    path = run_path(hand_case, "m", "t1", 1e-4, 0)
    raw = json.loads(path.read_text())
    damage(raw)
    path.write_text(json.dumps(raw))
    out = tmp_path / "report"
    code, err = run_tool([hand_case, "--out", out], capsys)
    assert code == 2 and str(path) in err and expected in err
    assert not out.exists()  # nothing written


def test_null_scores_and_losses_read_as_failed_runs(hand_case):
    """A writer of strict JSON puts null where json.dumps puts NaN; both mean an undefined number."""
    path = run_path(hand_case, "m", "t1", 1e-4, 0)
    raw = json.loads(path.read_text())
    raw.update(test={"accuracy": None}, train_loss_last=None, diverged=True)
    path.write_text(json.dumps(raw))
    failed = [r for r in load_results([hand_case]) if r.diverged]
    assert len(failed) == 1 and math.isnan(failed[0].test_score) and math.isnan(failed[0].train_loss_last)


def test_missing_results_exit_2(tmp_path, capsys):
    code, err = run_tool([tmp_path / "absent", "--out", tmp_path / "out"], capsys)
    assert code == 2 and f"{tmp_path / 'absent'}: no runs/ folder" in err
    (tmp_path / "empty" / "runs").mkdir(parents=True)
    with pytest.raises(ReportInputError, match="no run JSONs"):
        load_results([tmp_path / "empty"])
    (tmp_path / "broken" / "runs" / "m" / "t").mkdir(parents=True)
    (tmp_path / "broken" / "runs" / "m" / "t" / "lr0.0001_seed0.json").write_text("{not json")
    with pytest.raises(ReportInputError, match="lr0.0001_seed0.json: not a readable run JSON"):
        load_results([tmp_path / "broken"])


def test_duplicate_run_across_folders_is_an_error(hand_case):
    with pytest.raises(ReportInputError, match="also in"):
        load_results([hand_case, hand_case])


def test_existing_report_is_not_overwritten_without_force(hand_case, tmp_path, capsys):
    out = tmp_path / "report"
    assert run_tool([hand_case, "--out", out], capsys)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    write_run(hand_case, "m", "t1", "classification", 2e-4, 0, 0.70, 0.10)  # results changed since the report
    code, err = run_tool([hand_case, "--out", out], capsys)
    assert code == 2 and "already holds a report" in err and "--force" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert run_tool([hand_case, "--out", out, "--force"], capsys)[0] == 0
    assert (out / "main_table.csv").read_bytes() != before["main_table.csv"]


def write_released(root: Path, model: str, family: str, task: str, run: str, validation, test) -> None:
    """One run as the authors' EncodEval release stores it (per-example scores left out)."""
    path = root / model / family / task / run / "results.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"validation": {"score": validation, "scores_i": [1, 0]},
                                "test": {"score": test, "scores_i": [0, 1]}}))


def test_released_encodeval_results_read_as_run_records(tmp_path):
    from mlmclm.eval.reports.encodeval_results import load_encodeval_results

    root = tmp_path / "results"
    write_released(root, "610m-clm-42k", "SC", "mnli_m", "lr1e-04_sd3", 0.7, 0.71)
    write_released(root, "610m-clm-42k", "IR", "nq", "msmarco_pairs_lr5e-05_sd0", 0.3, None)
    by_task = {r.task: r for r in load_encodeval_results(root)}
    first, second = by_task["mnli"], by_task["nq"]
    assert (first.model, first.task, first.family, first.learning_rate, first.seed, first.test_score) == \
        ("610m-clm-42k", "mnli", "classification", 1e-4, 3, 0.71)
    assert (second.task, second.family, second.learning_rate, second.extra["trained_on"]) == \
        ("nq", "retrieval", 5e-5, "msmarco_pairs")
    assert second.diverged and math.isnan(second.test_score)


def test_distance_from_the_released_runs(tmp_path, capsys):
    ours, released = tmp_path / "eval", tmp_path / "results"
    for seed, score in enumerate([0.80, 0.82, 0.84]):
        write_run(ours, "610m-mlm40-42k", "sst2", "classification", 1e-4, seed, score, score)
        write_released(released, "610m-mlm40-42k", "SC", "sst2", f"lr1e-04_sd{seed}", score, score - 0.02)
        write_released(released, "610m-mlm40-42k", "SC", "sst2", f"lr5e-04_sd{seed}", 0.1, 0.99)  # loses on validation
    out = tmp_path / "report"
    code, _ = run_tool([ours, "--out", out, "--reference-encodeval", released], capsys)
    assert code == 0
    rows = {row["model"]: row for row in csv.DictReader((out / "main_table.csv").open())}
    assert float(rows["610m-mlm40-42k"]["sst2_paper"]) == pytest.approx(80.0)
    assert float(rows["610m-mlm40-42k"]["SC_distance_pp"]) == pytest.approx(2.0)
    assert "authors' released runs" in (out / "report.md").read_text()
    bad = tmp_path / "bad" / "610m-clm-42k" / "XX" / "sst2" / "lr1e-04_sd0"
    bad.mkdir(parents=True)
    (bad / "results.json").write_text("{}")
    code, err = run_tool([ours, "--out", tmp_path / "other", "--reference-encodeval", tmp_path / "bad"], capsys)
    assert code == 2 and "results.json: expected <model>/<SC|TC|QA|IR>" in err and not (tmp_path / "other").exists()
