"""The CLM detour family's CPU twin end to end through NeMo-Run's LocalExecutor, with the published settings: a tiny
ModernBERT made with `transformers` (transformers' own ModernBertForMaskedLM), imported by our convert_from_hf, its
step-0 held-out losses measured by the trainer's validation, the detour (phase 1 CLM, phase 2 the MLM decay at 15 %:
a 1-√ cooldown restarted from the peak with the optimizer state kept) and its control (phase 1 MLM at 30 %, the same
phase 2) trained from it, both exported as native ModernBertForMaskedLM (+ sentence-transformers), and the one
table: continued pretraining on the demo corpus lowers the tiny ModernBERT's held-out MLM loss. The tiny model
carries remote-code hooks (tests/planted_hooks.py), as real repositories do: neither the import nor the exports
carry them (issue 56). Run again with a task file, the same command adds the evaluation's grid on both exports and
the downstream table (issue 57 part 3)."""
import json
import math
from pathlib import Path

import pytest

from mlmclm.eval.finetune.protocol import load_records
from mlmclm.train import checkpoint as ckpt
from recipes.detour_report import validations
from tests.eval.eval_fixtures import make_task_folder
from tests.planted_hooks import plant_remote_code_hooks, remote_code_hooks

PHASE1, PHASE2, PEAK = 4, 2, 1e-3  # the twin: steps=4, decay_share=0.5; its peak (the floor a tenth of it)


# Six steps for each of two 2-rank runs, an import, a step-0 and a repeat measurement, two exports: 7 minutes wall
# time on this 2-core machine shared with other sessions (2 minutes of CPU), over the suite's 600 s default; with the
# evaluation (4 fine-tunings of 2 steps, the family launched again) 108 s on the same machine idle.
@pytest.mark.timeout(1500)
def test_tiny_detour_and_control_run_export_and_report(nemo_home, tmp_path, capsys):
    from transformers import AutoModelForMaskedLM

    from mlmclm.train.held_out import measure_checkpoint
    from recipes import detour
    from recipes.base import validate
    from recipes.detour_run import main

    root = tmp_path / "detour"
    plant_remote_code_hooks(detour.make_tiny_modernbert(root / "tiny_modernbert"))  # the family's default source
    assert main(["tiny", "--root", str(root), f"steps={PHASE1}", "decay_share=0.5", "validation_samples=8"]) == 0
    out = capsys.readouterr().out
    total = PHASE1 + PHASE2
    # the two runs' progress lines, printed side by side, each say whose they are
    assert f"[detour] {root / 'detour'}: new run of {total} steps" in out
    assert f"[control] {root / 'control'}: new run" in out
    unlabelled = [line for line in out.splitlines() if "step " in line and f"/{total} [" in line and line[:1] != "["]
    assert not unlabelled and f"[control] step     {total}/{total} [mlm_decay] loss" in out, out
    step0 = json.loads((root / "step0_held_out.json").read_text())["val/mlm/loss"]
    report = json.loads((root / "report.json").read_text())
    assert report["phase1_steps"] == PHASE1 and report["total_steps"] == total and report["step0"] == step0
    for name in ("detour", "control"):
        assert None not in report[name].values(), report
        assert report[name]["end"] < step0  # continued pretraining on the domain lowered the held-out MLM loss
    assert f"| detour (CLM {PHASE1} → MLM decay {PHASE2}) | {step0:.4f} | {report['detour']['switch']:.4f} |" in out
    assert f"| control (MLM {PHASE1} → MLM decay {PHASE2}) | {step0:.4f} |" in out

    # the published plan: phase 1 CLM (detour) or MLM 30 % (control), phase 2 MLM 15 % restarting the schedule
    configs = {name: ckpt.read_json(root / name / "checkpoints" / f"iter_{total:07d}", ckpt.RUN_CONFIG)
               for name in ("detour", "control")}
    assert [(p["objective"]["kind"], p["objective"]["mask_ratio"]) for p in configs["control"]["phases"]] == \
        [("mlm", 0.3), ("mlm", 0.15)]
    assert configs["detour"]["phases"][0]["objective"]["kind"] == "clm"
    for config in configs.values():
        assert config["checkpoint"]["init_from"] == str(root / "imported")
        assert config["model"]["architecture"] == "modernbert" and config["total_steps"] == total
        assert config["phases"][1]["restart_schedule"]["style"] == "cooldown"
        assert config["schedule"] == {**config["schedule"], "style": "constant", "warmup_tokens": 1024}
        assert (config["optimizer"]["beta2"], config["optimizer"]["eps"], config["optimizer"]["weight_decay"],
                config["optimizer"]["decoupled_weight_decay"]) == (0.98, 1e-6, 1e-5, True)
        assert config["validation"]["mask_ratio"] == 0.15
    rows = [json.loads(line) for line in (root / "detour" / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["clm"] * PHASE1 + ["mlm_decay"] * PHASE2
    # the LR: one warmup step (1,024 tokens = one step of 8 × 128), constant, then from the peak again, 1-√ down
    floor = PEAK / 10
    want = [0.0, PEAK, PEAK, PEAK, PEAK, floor + (PEAK - floor) * (1 - math.sqrt(1 / PHASE2))]
    assert [r["train/lr"] for r in rows] == pytest.approx(want, rel=1e-9)

    # step 0 is the trainer's own validation: measured the same way, the control's end weights give what the
    # trainer recorded at its end
    plan = detour.tiny_detour(str(root / "tiny_modernbert"), str(root / "data"), str(root), steps=PHASE1,
                              decay_share=0.5, validation_samples=8)
    again = measure_checkpoint(validate(plan.control), str(root / "control"), tmp_path / "again.json", 2)
    assert again["val/mlm/loss"] == pytest.approx(validations(root / "control")[total]["val/mlm/loss"], abs=1e-6)

    for name in ("detour", "control"):  # both exported: transformers and sentence-transformers load them
        model = AutoModelForMaskedLM.from_pretrained(root / "export" / name, trust_remote_code=False)
        assert type(model).__name__ == "ModernBertForMaskedLM"
        assert (root / "export" / name / "modules.json").exists()
        assert remote_code_hooks(root / "export" / name) == []
    assert remote_code_hooks(root / "imported") == []
    st = pytest.importorskip("sentence_transformers")
    assert st.SentenceTransformer(str(root / "export" / "detour"), device="cpu").encode_query(["a"]).shape[-1] == 128

    # the same family again with the user's tasks: nothing trained or exported again; both exports fine-tuned in
    # the evaluation's grid (one output folder), two seeds each, and the scores beside the held-out loss
    exported = (root / "export" / "detour" / "config.json").stat().st_mtime
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([{"name": "sentiment", "family": "classification", "max_length": 32, "path": str(
        make_task_folder(tmp_path / "sentiment", "classification", sizes=(16, 8, 8)))}]))
    assert main(["tiny", "--root", str(root), f"steps={PHASE1}", "decay_share=0.5", "validation_samples=8",
                 "--tasks", str(tasks), "--lrs", "1e-3", "--max-steps", "2", "--batch-size", "8",
                 "--seeds", "0", "1"]) == 0
    out = capsys.readouterr().out
    assert (root / "export" / "detour" / "config.json").stat().st_mtime == exported
    records = load_records(root / "eval")
    assert sorted((r.model, r.seed) for r in records) == [("control", 0), ("control", 1), ("detour", 0), ("detour", 1)]
    assert all(Path(r.model_dir) == root / "export" / r.model for r in records)
    downstream = json.loads((root / "report.json").read_text())["downstream"]
    for name in ("detour", "control"):
        cell = downstream["runs"][name]["sentiment"]
        scores = [r.test_score for r in records if r.model == name]
        assert (cell["seeds"], cell["lr"]) == (2, 1e-3) and cell["mean"] == pytest.approx(sum(scores) / 2)
        assert cell["ci95"] is not None and cell["ci95"] >= 0
        assert f"| {name} | {report[name]['end']:.4f} | {100 * cell['mean']:.1f} ± {100 * cell['ci95']:.1f} " \
               f"(2 seeds) |" in out, out


def test_detour_refusals_are_one_line(tmp_path, capsys):
    from recipes.detour_run import main

    assert main(["eurobert", "--root", str(tmp_path / "r"), "--source", "EuroBERT/EuroBERT-210m"]) == 2
    assert "eurobert needs --source and --data-path" in capsys.readouterr().err
    assert main(["modernbert", "--root", str(tmp_path / "r"), "--data-path", str(tmp_path)]) == 2
    assert "modernbert needs --source and --data-path" in capsys.readouterr().err
    assert main(["tiny", "--root", str(tmp_path / "r"), "--source", str(tmp_path), "stepz=3"]) == 2
    assert "'stepz=3': expected key=value with key one of" in capsys.readouterr().err
    assert main(["tiny", "--root", str(tmp_path / "r"), "--source", str(tmp_path), "steps=abc"]) == 2
    assert "detour (tiny_detour): parameter steps='abc' is a str; it takes int" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # refused before any model or data was made


def test_the_family_is_listed_and_runs_from_python_m_recipes(tmp_path, capsys):
    from recipes.__main__ import main

    assert main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert "detour modernbert|eurobert|tiny|report" in listed and "recipes/detour_run.py" in listed, listed
    # `python -m recipes detour ...` is recipes.detour_run, with its arguments and its one-line refusals
    assert main(["detour", "eurobert", "--root", str(tmp_path / "r"), "--source", "EuroBERT/EuroBERT-210m"]) == 2
    assert "eurobert needs --source and --data-path" in capsys.readouterr().err


def test_the_twin_refuses_a_plan_without_both_phases(tmp_path):
    from recipes import detour

    source = detour.make_tiny_modernbert(tmp_path / "m")
    with pytest.raises(ValueError, match="decay_share must be in \\(0, 1\\]"):
        detour.tiny_detour(str(source), str(tmp_path / "d"), str(tmp_path / "r"), decay_share=0.0)
    with pytest.raises(ValueError, match="leaves no step for phase 2"):
        detour.tiny_detour(str(source), str(tmp_path / "d"), str(tmp_path / "r"), steps=1)
    with pytest.raises(ValueError, match="must end inside phase 1"):
        detour.tiny_detour(str(source), str(tmp_path / "d"), str(tmp_path / "r"), steps=4, warmup_tokens=4096)


def test_the_published_settings_are_the_defaults(tmp_path):
    from mlmclm.model import preset
    from recipes import detour
    from recipes.base import validate

    # detour_published's arguments, with the model given (no hub here): ModernBERT-base, phase 1 on 10B tokens
    plan = detour.detour_plan("answerdotai/ModernBERT-base", "/data/bio", str(tmp_path / "r"),
                              steps=detour.steps_for_tokens(detour.PHASE1_TOKENS), global_batch_size=detour.GLOBAL_BATCH,
                              nodes=1, gpus_per_node=4, max_micro_batch=2, seq_length=detour.SEQ_LENGTH,
                              tokenizer=None, seed=17, model=preset("modernbert-base"))
    detour_cfg, control_cfg = validate(plan.detour), validate(plan.control)
    assert plan.phase1_steps == 3179 and detour_cfg.phase_steps() == [3179, 318]  # 10B tokens, then 0.1·n
    assert detour_cfg.global_batch_size == 384 and detour_cfg.precision.fp8 is None
    assert [p.objective.kind for p in detour_cfg.phases] == ["clm", "mlm"]
    assert [p.objective.mask_ratio for p in control_cfg.phases] == [0.3, 0.15]
    assert detour_cfg.phases[1].objective.mask_ratio == 0.15
    opt = detour_cfg.optimizer
    assert (opt.lr, opt.min_lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay, opt.decoupled_weight_decay) == \
        (2e-4, 2e-5, 0.9, 0.98, 1e-6, 1e-5, True)
    assert detour_cfg.schedule_spans()[0][1].warmup_tokens == 100_000_000
    assert detour_cfg.schedule_spans()[1] == (3179, detour_cfg.phases[1].restart_schedule)
    assert detour_cfg.phases[1].restart_schedule.decay_shape == "minus_sqrt"


def test_the_twin_takes_a_users_text_tokenized_with_the_source(tmp_path):
    from mlmclm.data.manifest import Manifest
    from recipes import detour
    from recipes.detour_run import prepare_twin_data

    source = detour.make_tiny_modernbert(tmp_path / "m")
    texts = []
    for i in range(16):
        path = tmp_path / f"doc{i}.txt"
        path.write_text(f"Patient {i} was given aspirin and recovered after {i + 2} days. " * 20)
        texts.append(str(path))
    data = prepare_twin_data(tmp_path / "root", texts, source)
    manifest = Manifest.load(str(data))
    assert manifest.validation and manifest.seq_length == 128
