"""The CLM detour family's CPU twin end to end through NeMo-Run's LocalExecutor: a tiny EuroBERT made with
`transformers`, imported by our convert_from_hf, its step-0 held-out losses measured by the trainer's validation,
the detour (CLM → MLM decay) and its control (MLM only) trained from it, both exported (HF + sentence-transformers),
and the one table. The tiny EuroBERT carries remote-code hooks (tests/planted_hooks.py), as the real one's repository
does: neither the import nor the exports carry them (issue 56)."""
import json

import pytest

from mlmclm.train import checkpoint as ckpt
from recipes.detour_report import validations
from tests.planted_hooks import plant_remote_code_hooks, remote_code_hooks


def test_tiny_detour_and_control_run_export_and_report(nemo_home, tmp_path, capsys):
    from transformers import AutoModelForMaskedLM

    from mlmclm.train.held_out import measure_checkpoint
    from recipes import detour
    from recipes.base import validate
    from recipes.detour_run import main

    root = tmp_path / "detour"
    plant_remote_code_hooks(detour.make_tiny_eurobert(root / "tiny_eurobert"))  # the family's default source
    assert main(["tiny", "--root", str(root), "steps=4", "validation_samples=8"]) == 0
    out = capsys.readouterr().out
    # the two runs' progress lines, printed side by side, each say whose they are
    assert f"[detour] {root / 'detour'}: new run of 4 steps" in out and f"[control] {root / 'control'}: new run" in out
    unlabelled = [line for line in out.splitlines() if "step " in line and "/4 [" in line and line[:1] != "["]
    assert not unlabelled and "[control] step     4/4 [mlm] loss" in out, out
    step0 = json.loads((root / "step0_held_out.json").read_text())["val/mlm/loss"]
    report = json.loads((root / "report.json").read_text())
    assert report["clm_steps"] == 2 and report["total_steps"] == 4 and report["step0"] == step0
    for name in ("detour", "control"):
        assert None not in report[name].values(), report
        assert report[name]["end"] < step0  # trained on the domain: the held-out MLM loss went down
    assert f"| detour (CLM 2 → MLM 2) | {step0:.4f} | {report['detour']['switch']:.4f} |" in out
    assert f"| control (MLM 4) | {step0:.4f} |" in out

    # the detour is CLM then MLM, the control MLM only; same steps, both from the import, the decay = the MLM phase
    configs = {name: ckpt.read_json(root / name / "checkpoints" / "iter_0000004", ckpt.RUN_CONFIG)
               for name in ("detour", "control")}
    assert [p["objective"]["kind"] for p in configs["detour"]["phases"]] == ["clm", "mlm"]
    assert [p["objective"]["kind"] for p in configs["control"]["phases"]] == ["mlm"]
    for config in configs.values():
        assert config["checkpoint"]["init_from"] == str(root / "imported")
        assert config["schedule"]["decay_steps"] == 2 and config["total_steps"] == 4
    rows = [json.loads(line) for line in (root / "detour" / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["clm", "clm", "mlm", "mlm"]

    # step 0 is the trainer's own validation: measured the same way, the control's end weights give what the
    # trainer recorded at its end
    plan = detour.tiny_detour(str(root / "tiny_eurobert"), str(root / "data"), str(root), steps=4,
                              validation_samples=8)
    again = measure_checkpoint(validate(plan.control), str(root / "control"), tmp_path / "again.json", 2)
    assert again["val/mlm/loss"] == pytest.approx(validations(root / "control")[4]["val/mlm/loss"], abs=1e-6)

    for name in ("detour", "control"):  # both exported: transformers and sentence-transformers load them
        AutoModelForMaskedLM.from_pretrained(root / "export" / name, trust_remote_code=False)
        assert (root / "export" / name / "modules.json").exists()
        assert remote_code_hooks(root / "export" / name) == []
    assert remote_code_hooks(root / "imported") == []
    st = pytest.importorskip("sentence_transformers")
    assert st.SentenceTransformer(str(root / "export" / "detour"), device="cpu").encode_query(["a"]).shape[-1] == 128


def test_detour_refusals_are_one_line(tmp_path, capsys):
    from recipes.detour_run import main

    assert main(["eurobert", "--root", str(tmp_path / "r"), "--source", "EuroBERT/EuroBERT-210m"]) == 2
    assert "eurobert needs --source and --data-path" in capsys.readouterr().err
    assert main(["tiny", "--root", str(tmp_path / "r"), "--source", str(tmp_path), "stepz=3"]) == 2
    assert "'stepz=3': expected key=value with key one of" in capsys.readouterr().err
    assert main(["tiny", "--root", str(tmp_path / "r"), "--source", str(tmp_path), "steps=abc"]) == 2
    assert "detour (tiny_detour): parameter steps='abc' is a str; it takes int" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()  # refused before any model or data was made


def test_the_family_is_listed_and_runs_from_python_m_recipes(tmp_path, capsys):
    from recipes.__main__ import main

    assert main(["--list"]) == 0
    listed = capsys.readouterr().out
    assert "detour eurobert|tiny|report" in listed and "recipes/detour_run.py" in listed, listed
    # `python -m recipes detour ...` is recipes.detour_run, with its arguments and its one-line refusals
    assert main(["detour", "eurobert", "--root", str(tmp_path / "r"), "--source", "EuroBERT/EuroBERT-210m"]) == 2
    assert "eurobert needs --source and --data-path" in capsys.readouterr().err


def test_the_twin_refuses_a_share_without_both_phases(tmp_path):
    from recipes import detour

    source = detour.make_tiny_eurobert(tmp_path / "m")
    with pytest.raises(ValueError, match="clm_share must be strictly between 0 and 1"):
        detour.tiny_detour(str(source), str(tmp_path / "d"), str(tmp_path / "r"), clm_share=1.0)
    with pytest.raises(ValueError, match="leaves no CLM or no MLM step"):
        detour.tiny_detour(str(source), str(tmp_path / "d"), str(tmp_path / "r"), steps=1)


def test_the_twin_takes_a_users_text_tokenized_with_the_source(tmp_path):
    from mlmclm.data.manifest import Manifest
    from recipes import detour
    from recipes.detour_run import prepare_twin_data

    source = detour.make_tiny_eurobert(tmp_path / "m")
    texts = []
    for i in range(16):
        path = tmp_path / f"doc{i}.txt"
        path.write_text(f"Patient {i} was given aspirin and recovered after {i + 2} days. " * 20)
        texts.append(str(path))
    data = prepare_twin_data(tmp_path / "root", texts, source)
    manifest = Manifest.load(str(data))
    assert manifest.validation and manifest.seq_length == 128
