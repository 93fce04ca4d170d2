"""`make demo` end to end, shortened: data → recipe run on 2 processes → HF exports + random baseline → fill-mask
on held-back lines → smoke evaluation of the three → plots; its console shows our stages, not NeMo-Run's."""
import json
import subprocess
import sys

from transformers import AutoModelForMaskedLM, AutoTokenizer


def test_demo_pipeline_runs_end_to_end(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "mlmclm.demo", "--steps", "8", "--output", str(out)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    console = proc.stdout
    # Learning measured against baselines the demo prints itself.
    assert "unigram entropy" in console and "nats below it" in console
    assert "masked-token loss" in console and "truth '" in console  # fill-mask scores and examples
    for label in ("random init", "CLM25", "CLM25→MLM75"):
        assert f"{label} " in console
    assert "smoke_which_play accuracy" in console
    # Quiet: NeMo-Run's banners and hints are in its log file, no third-party warning walls anywhere.
    assert "Entering Experiment" not in console and "nemo experiment" not in console
    assert "Entering Experiment" in (out / "nemo_run.log").read_text()
    assert "Warning" not in proc.stderr and "Transformer Engine" not in proc.stderr, proc.stderr[-2000:]

    steps = [json.loads(line)["step"] for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))
    for name in ("iter_0000002", "iter_0000008", "random_init"):  # CLM phase end, final, baseline
        model = AutoModelForMaskedLM.from_pretrained(out / "hf" / name)
        tokenizer = AutoTokenizer.from_pretrained(out / "hf" / name)
        assert model.config.model_type == "eurobert" and tokenizer.mask_token is not None
    runs = {p.name for p in (out / "eval" / "runs").iterdir()}
    assert runs == {"random init", "CLM25", "CLM25→MLM75"}
    assert (out / "plots.png").stat().st_size > 0
