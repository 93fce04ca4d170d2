"""`python -m recipes NAME --help`: that recipe's parameters, each with the type it takes and its default, read from
its builder's signature (what `key=value` is checked against, recipes.parameter_types), so the list cannot drift
from the code the way recipes/README.md's table could."""
from __future__ import annotations

import inspect
import types
import typing


def type_name(hint) -> str:
    """`int`, `int | None`, `list[int]`: the annotation as a reader writes it."""
    if hint is None:
        return "any"
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return "None"
    if isinstance(hint, type) and not typing.get_args(hint):
        return hint.__name__
    return str(hint).replace("typing.", "")


def recipe_help(name: str) -> str:
    from recipes import registry

    recipe = registry.get(name)
    try:
        hints = typing.get_type_hints(recipe.builder)
    except (NameError, TypeError):  # an annotation that cannot be resolved: shown without types
        hints = {}
    params = recipe.parameters()
    width = max(len(p) for p in params) + 1
    lines = [f"python -m recipes {name} [key=value ...] [--executor local|slurm] [--dryrun] [--then RECIPE]",
             "", recipe.summary, "", "Parameters (key=value; type, default):"]
    for param, default in params.items():
        shown = "required" if default is inspect.Parameter.empty else f"default {default!r}"
        lines.append(f"  {param:<{width}} {type_name(hints.get(param))}, {shown}")
    if recipe.fixed:
        lines.append("Fixed by the name: " + ", ".join(f"{k}={v!r}" for k, v in recipe.fixed.items()))
    lines += ["", "Also: dotted TrainConfig paths (optimizer.lr=3e-4, checkpoint.stop_at=100) and executor.KEY=VALUE.",
              "The launcher's options: python -m recipes --help; every recipe: python -m recipes --list"]
    return "\n".join(lines)
