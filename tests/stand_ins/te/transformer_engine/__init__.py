"""A test-only stand-in for Transformer Engine (see tests/stand_ins/transformer_engine_stand_in.py for what it models).

Never importable by accident: its directory goes on `sys.path` only through `transformer_engine_stand_in.on_path()`
in the tests that ask for it. The version is the newest TE whose rules the stand-ins were read from (2.20's
development head; the extra-state refusal arrived in 2.18).

Enough of `transformer_engine.pytorch` for megatron-core 0.19's TE extension to import and its TE layer spec to build
and train (TP + SP + PP, THD attention, fused THD RoPE, the fused norm+linear modules, the norms): see
`pytorch/__init__.py`. Put on the path in a rank before megatron is imported there, every megatron module sees TE
present, as on a GPU machine with TE (tests/train/test_te_layer_spec_run.py).
"""
__version__ = "2.20.0.dev0+standin"
STAND_IN = True


def set_version(version: str) -> str:
    """Switch the version-dependent rules the stand-in models (the extra state's: TE 2.2-2.17 or >= 2.18); returns
    the previous version. megatron caches the version it reads (`get_te_version`) at its first look."""
    global __version__
    previous, __version__ = __version__, version
    return previous
