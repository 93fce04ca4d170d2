"""Putting the Transformer Engine stand-in (tests/stand_ins/te/transformer_engine) on `sys.path`, and only there.

`on_path()` is for a test in pytest's own process: the directory goes first on `sys.path` for the duration, and
afterwards every `transformer_engine` module is dropped from `sys.modules`, so no later test sees it. `install()` is
for a spawned rank that is the stand-in's for its whole life (nothing restores it: the process ends)."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

ROOT = str(Path(__file__).parent / "te")


def install() -> None:
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)


def _purge() -> None:
    for name in [n for n in sys.modules if n == "transformer_engine" or n.startswith("transformer_engine.")]:
        del sys.modules[name]


@contextlib.contextmanager
def on_path():
    already = any(n == "transformer_engine" for n in sys.modules)
    if already and not getattr(sys.modules["transformer_engine"], "STAND_IN", False):
        raise RuntimeError("a real transformer_engine is imported in this process: the stand-in would shadow it")
    install()
    try:
        yield
    finally:
        sys.path.remove(ROOT)
        _purge()
