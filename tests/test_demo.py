"""`make demo` end to end, shortened: data → recipe run on 2 processes → HF exports + random baseline → fill-mask
on held-back lines → smoke evaluation of the three → plots; its console shows our stages, not NeMo-Run's."""
import json
import os
import re
import subprocess
import sys

from transformers import AutoModelForMaskedLM, AutoTokenizer


def test_demo_pipeline_runs_end_to_end(tmp_path):
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "recipes.demo", "--steps", "8", "--smoke-steps", "4",
                           "--output", str(out)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "MLMCLM_PROGRESS_SECONDS": "0.2"})  # 30 s by default
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    console = proc.stdout
    # Learning measured against baselines the demo prints itself.
    assert "unigram entropy" in console and "nats below it" in console
    assert "masked-token loss" in console and "truth '" in console  # fill-mask scores and examples
    assert "unigram      masked-token loss" in console  # the frequency-only bar on the same masked tokens
    assert "through Hugging Face: pipeline('fill-mask'" in console
    assert "'Now is the winter of our <|mask|>.': " in console
    for label in ("random init", "CLM25", "CLM25→MLM75"):
        assert f"{label} " in console
    assert "smoke_speaker_names entity_f1" in console and "smoke_named_character f1" in console
    # Stage 5 in a pipe (a log file, no terminal): progress lines while the 6 fine-tuning runs go, no bar.
    assert re.search(r"^evaluation runs: [1-5]/6 done, [1-5] left, ETA .*; last finished: ", proc.stderr, re.M)
    assert re.search(r"^evaluation runs: 6/6 done in [0-9.]+ (s|min)$", proc.stderr, re.M) and "\r" not in proc.stderr
    # Quiet: NeMo-Run's banners and hints are in its log file, no third-party warning walls anywhere.
    assert "Entering Experiment" not in console and "nemo experiment" not in console
    assert "Entering Experiment" in (out / "nemo_run.log").read_text()
    assert "Warning" not in proc.stderr and "Transformer Engine" not in proc.stderr, proc.stderr[-2000:]

    steps = [json.loads(line)["step"] for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9))
    # Held-out losses of both objectives beside the training ones, on the split the demo's data holds out.
    assert json.loads((out / "data" / "manifest.json").read_text())["validation"]["num_documents"] == 5
    assert "validation on the held-out works" in console and "step    8: CLM " in console
    rows = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "val/mlm/loss" in r and "val/clm/loss" in r] == steps  # 8 steps: every one
    for name in ("iter_0000002", "iter_0000008", "random_init"):  # CLM phase end, final, baseline
        model = AutoModelForMaskedLM.from_pretrained(out / "hf" / name)
        tokenizer = AutoTokenizer.from_pretrained(out / "hf" / name)
        assert model.config.model_type == "eurobert" and tokenizer.mask_token is not None
    runs = {p.name for p in (out / "eval" / "runs").iterdir()}
    assert runs == {"random init", "CLM25", "CLM25→MLM75"}
    assert (out / "plots.png").stat().st_size > 0
    assert "the demo's bar for using context" in console
    # Again: the finished run is reused, and the console says so instead of looking like a 30 s training run.
    again = subprocess.run([sys.executable, "-m", "recipes.demo", "--steps", "8", "--skip-eval", "--output", str(out)],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"{out / 'run'}: already finished at step 8; nothing to train" in again.stdout


def test_unigram_fill_mask_baseline_scores_the_models_masked_tokens():
    """The baseline is scored on exactly the positions fill_mask_scores masks, with add-one smoothed frequencies."""
    import math
    from collections import Counter

    from mlmclm.data.tokenizer import load_tokenizer
    from recipes.demo import masked_positions, unigram_fill_mask_scores

    tokenizer = load_tokenizer("embedded")
    passages = ["To be, or not to be, that is the question:", "Whether 'tis nobler in the mind to suffer"]
    drawn = masked_positions(tokenizer, passages, 0.3, seed=0)
    assert drawn == masked_positions(tokenizer, passages, 0.3, seed=0)  # fixed seed: same tokens for every model
    targets = [ids[p] for ids, picked in drawn for p in picked]
    counts = Counter({targets[0]: 7, 5000: 3})  # one target seen 7 times, the rest unseen
    n, vocab = 10, len(tokenizer)
    expected = -sum(math.log((counts.get(t, 0) + 1) / (n + vocab)) for t in targets) / len(targets)
    loss, accuracy = unigram_fill_mask_scores(tokenizer, counts, passages, 0.3, seed=0)
    assert math.isclose(loss, expected, rel_tol=1e-9)
    assert accuracy == targets.count(targets[0]) / len(targets)  # always guessing the most frequent token
