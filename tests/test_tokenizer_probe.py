"""A hostile tokenizer.json — a catastrophic `Split` pattern, a template that makes the Rust library panic (a
BaseException that escaped every `except Exception`) — is refused in one line naming it, within a bounded time,
before the evaluation relies on it; a sound tokenizer passes."""
import json
import sys
import time
from pathlib import Path

import pytest

from mlmclm.tokenizer_probe import TokenizerRefusedError, probe_tokenizer

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "eval"))
from eval_fixtures import evaluate_main, save_tiny_model  # noqa: E402


def _model(directory: Path, edit=None) -> Path:
    save_tiny_model(directory)
    if edit is not None:
        path = directory / "tokenizer.json"
        spec = json.loads(path.read_text())
        edit(spec)
        path.write_text(json.dumps(spec))
    return directory


def _catastrophic(spec):
    """The issue's kind of pattern: it backtracks exponentially over a run of words with no digit after it; the
    regex engine's retry limit then ends the search with a panic (after seconds per line with longer patterns)."""
    spec["pre_tokenizer"] = {"type": "Split", "pattern": {"Regex": r"((\w+)\s*)+\d"}, "behavior": "Isolated",
                             "invert": False}


def _slow(spec):  # 20,000 regex replacements per text: tens of milliseconds a line, seconds for the probe
    spec["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Replace", "pattern": {"Regex": "z{2,}q"}, "content": "z"}] * 20_000}


def _panicking(spec):  # a template naming a special token the tokenizer does not define: Rust's "no entry found"
    spec["post_processor"] = {"type": "TemplateProcessing", "special_tokens": {}, "pair": [], "single": [
        {"SpecialToken": {"id": "[NOT-THERE]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]}


def test_a_sound_tokenizer_passes(tmp_path):
    probe_tokenizer(_model(tmp_path / "m"))


@pytest.mark.parametrize("edit, cause", [(_catastrophic, "Onig: Regex search error: retry-limit-in-match over"),
                                         (_panicking, "no entry found for key")])
def test_a_panic_is_one_line(tmp_path, edit, cause):
    model = _model(tmp_path / "m", edit)
    with pytest.raises(TokenizerRefusedError) as caught:
        probe_tokenizer(model)
    assert str(caught.value) == (f"{model / 'tokenizer.json'}: refused: the tokenizers library panicked on ordinary "
                                 f"text: {cause}")


def test_a_tokenizer_too_slow_is_killed_at_the_deadline(tmp_path):
    model = _model(tmp_path / "m", _slow)
    started = time.monotonic()
    with pytest.raises(TokenizerRefusedError, match=rf"^{model / 'tokenizer.json'}: refused: it did not encode 64 "
                                                    r"ordinary lines in 1 s \(a sound tokenizer takes milliseconds\)"):
        probe_tokenizer(model, timeout_s=1)
    assert time.monotonic() - started < 5


def test_evaluate_refuses_a_panicking_tokenizer_before_any_run(tmp_path, capsys):
    """The old code let the PanicException escape evaluate.py's `except` clauses: a Rust traceback."""
    model = _model(tmp_path / "m", _panicking)
    folder = tmp_path / "task"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": f"a cat {i}", "label": i % 2}) + "\n"
                                                for i in range(8)))
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps([{"name": "t", "family": "classification", "path": str(folder)}]))
    capsys.readouterr()
    assert evaluate_main()(["grid", "--model", f"m={model}", "--tasks", str(tasks), "--lrs", "1e-3", "--seeds", "0",
                     "--max-steps", "1", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == (f"evaluate: error: {model / 'tokenizer.json'}: refused: the tokenizers library panicked on "
                   f"ordinary text: no entry found for key\n")
    assert not (tmp_path / "out" / "runs").exists()
