"""A tokenizer.json from others is tried on ordinary text, bounded in time, before anything relies on it.

A tokenizer file is data, but data the Rust `tokenizers` library executes: a pre-tokenizer `Split` pattern can
backtrack catastrophically (0.9 s per 10-word line: weeks for an evaluation set; exponential patterns never end, and
a Rust regex cannot be interrupted from Python), and a malformed template or truncation makes the library panic —
a `PanicException`, which is a BaseException and escapes every `except Exception`. `probe_tokenizer` loads the file
in a child process and encodes a fixed set of ordinary lines (single texts and pairs, as the fine-tuning does) under
a deadline: a child that is late is killed, and a panic or any other failure is reported; either way the refusal is
one line naming the file. The file is first checked to be a regular file of bounded size.

Not covered: text that only some inputs make slow or make panic (the probe is ordinary text), and tokenizers
without a tokenizer.json (transformers converts them itself).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mlmclm.bounded_read import open_regular_file

TOKENIZER_FILE_LIMIT = 128 << 20  # the largest real tokenizer.json is about 35 MB
PROBE_TIMEOUT_S = 20.0  # a sound tokenizer encodes the probe in milliseconds; the child's start takes ~0.3 s
# Ordinary text: mostly plain runs of 8 to 20 words (where a backtracking pattern blows up), some with digits,
# punctuation and non-ASCII letters.
_PLAIN = ("the model reads every sentence of the evaluation set once before it is trained on the task and then "
          "scores each example of the held out split with the head it learned during fine tuning").split()
_MIXED = ["In 2024, the café's naïve über-straße test (東京) scored 3.14 — or 1,000,000? Yes: it-does_end!",
          "Résumé: «quoted» text; tabs\tand  double  spaces, emoji 🙂 and Ελληνικά too."]
PROBE_LINES = [" ".join(_PLAIN[i % 7: i % 7 + 8 + i % 13]) for i in range(56)] + _MIXED * 4

_CHILD = """
import json, sys
from tokenizers import Tokenizer
lines = json.loads(sys.stdin.read())
try:
    tokenizer = Tokenizer.from_file(sys.argv[1])
    for first, second in zip(lines, lines[1:] + lines[:1]):
        tokenizer.encode(first)
        tokenizer.encode(first, second)
    print(json.dumps({"ok": True}))
except BaseException as err:  # a PanicException too: it is a BaseException
    print(json.dumps({"ok": False, "type": type(err).__name__, "message": str(err)}))
"""


class TokenizerRefusedError(ValueError):
    """A tokenizer file that is not a regular file of bounded size, does not load, panics or is too slow."""


def probe_tokenizer(model_dir: str | Path, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Refuse `model_dir`'s tokenizer.json (TokenizerRefusedError naming it) unless it encodes PROBE_LINES within
    `timeout_s` without failing. A directory without a tokenizer.json is left to its loader."""
    path = Path(model_dir) / "tokenizer.json"
    if not os.path.lexists(path):
        return
    with open_regular_file(path, TOKENIZER_FILE_LIMIT, "tokenizer file"):
        pass  # a FIFO, a device or a file past the bound is refused here, before the library opens it
    env = {**os.environ, "RUST_BACKTRACE": "0", "TOKENIZERS_PARALLELISM": "false"}
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, str(path)], input=json.dumps(PROBE_LINES),
                              capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        raise TokenizerRefusedError(f"{path}: refused: it did not encode {len(PROBE_LINES)} ordinary lines in "
                                    f"{timeout_s:g} s (a sound tokenizer takes milliseconds): a pre-tokenizer pattern "
                                    f"that backtracks without end?") from None
    try:
        outcome = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise TokenizerRefusedError(f"{path}: refused: the tokenizer's process died (exit {done.returncode}): "
                                    f"{last}") from None
    if not outcome["ok"]:
        what = ("the tokenizers library panicked on ordinary text" if outcome["type"] == "PanicException"
                else f"it does not load or encode ordinary text ({outcome['type']})")
        first = (outcome["message"].strip().splitlines() or [""])[0][:300]
        raise TokenizerRefusedError(f"{path}: refused: {what}: {first}")
