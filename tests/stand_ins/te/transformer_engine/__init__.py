"""A test-only stand-in for Transformer Engine (see tests/stand_ins/transformer_engine_stand_in.py for what it models).

Never importable by accident: its directory goes on `sys.path` only through `transformer_engine_stand_in.on_path()`
in the tests that ask for it. The version is the newest TE whose rules the stand-ins were read from (2.20's
development head; the extra-state refusal arrived in 2.18).
"""
__version__ = "2.20.0.dev0+standin"
STAND_IN = True
