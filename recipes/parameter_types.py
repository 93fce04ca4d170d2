"""A recipe parameter's value checked against its builder's annotation before the builder runs, so `steps=abc`
is refused naming the parameter and the type it takes, not by whatever arithmetic it breaks inside the builder."""
from __future__ import annotations

import types
import typing
from typing import Any, Callable

_SIMPLE = (bool, int, float, str, list, tuple, dict, type(None))


def _allowed(hint) -> tuple[type, ...] | None:
    """The value types an annotation accepts; None where it says nothing this check can hold a value to."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        parts = [_allowed(arg) for arg in typing.get_args(hint)]
        return None if any(p is None for p in parts) else tuple(t for p in parts for t in p)
    base = origin or hint
    if base is float:
        return (float, int)   # 3 is a fine learning rate or share
    if base is tuple:
        return (tuple, list)  # a command line gives [a, b]
    return (base,) if base in _SIMPLE else None


def _fits(value: Any, allowed: tuple[type, ...]) -> bool:
    if isinstance(value, bool):   # a bool is an int to Python, never to a recipe
        return bool in allowed
    return isinstance(value, allowed)


def check_parameter_types(recipe_name: str, builder: Callable, params: dict) -> None:
    try:
        hints = typing.get_type_hints(builder)
    except (NameError, TypeError):   # an annotation this module cannot resolve: the builder checks for itself
        return
    for name, value in params.items():
        allowed = _allowed(hints.get(name))
        if allowed is not None and not _fits(value, allowed):
            names = " or ".join(dict.fromkeys("None" if t is type(None) else t.__name__ for t in allowed))
            raise ValueError(f"recipe {recipe_name}: parameter {name}={value!r} is a {type(value).__name__}; it takes "
                             f"{names}")
