"""The encoders on megatron-core (EuroBERT, ModernBERT): config presets, layer specs, builder, HF weight mapping.

The names below load on first use: a process that only reads a config (`python -m recipes ... --help`, a recipe's
or the sweep's dry run, tests/recipes/test_driver_imports.py) does not import megatron-core for them."""
from importlib import import_module

_HOMES = {"build_model": "build", "is_causal": "build", "set_causal": "build", "PRESETS": "config",
          "ModelConfig": "config", "preset": "config", "PrecisionConfig": "precision", "rope_theta": "rope",
          "set_rope_theta": "rope"}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
