"""`make demo` end to end, shortened: data → recipe run on 2 processes → HF export → smoke evaluation → comparison."""
import json
import subprocess
import sys

from transformers import AutoModelForMaskedLM, AutoTokenizer


def test_demo_pipeline_runs_end_to_end(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "mlmclm.demo", "--steps", "8", "--output", str(out)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "final losses: CLM" in proc.stdout and "MLM" in proc.stdout

    steps = [json.loads(line)["step"] for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))
    for name in ("iter_0000002", "iter_0000008"):  # the CLM phase end and the final checkpoint
        model = AutoModelForMaskedLM.from_pretrained(out / "hf" / name)
        tokenizer = AutoTokenizer.from_pretrained(out / "hf" / name)
        assert model.config.model_type == "eurobert" and tokenizer.mask_token is not None
    summaries = list((out / "eval").glob("*/summary.md"))
    assert len(summaries) == 2 and all("smoke_who_says" in s.read_text() for s in summaries)
    assert (out / "compare" / "comparison.md").exists()
