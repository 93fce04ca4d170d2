"""A recipe name plus `key=value` overrides → a validated `run.Partial` (recipes.launch runs it).

Overrides are of three kinds, told apart by their key:
  * a recipe parameter (`nodes=4`, `mask_ratio=0.3`, `total_steps=12000`, ...): passed to the builder, so derived
    values (micro batch, phase lengths, run dir) follow;
  * `executor.KEY=VALUE`: an argument of the executor factory (`cluster.executors`);
  * any other dotted path into the TrainConfig (`optimizer.lr=3e-4`, `phases.1.objective.mask_ratio=0.3`,
    optionally prefixed `config.`): set on the built `run.Config` tree.
The result is validated again after the overrides.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import fiddle as fdl
import nemo_run as run

from mlmclm.config_io import parse_value
from recipes import registry
from recipes.base import validate


@dataclass
class Overrides:
    recipe: dict = field(default_factory=dict)
    executor: dict = field(default_factory=dict)
    config: list[tuple[list[str], object]] = field(default_factory=list)


def split_overrides(recipe: registry.Recipe, items: list[str]) -> Overrides:
    out = Overrides()
    params = recipe.parameters()
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} is not of the form key=value")
        value = parse_value(raw)
        if key.startswith("executor."):
            out.executor[key.removeprefix("executor.")] = value
        elif key in params:
            out.recipe[key] = value
        else:
            out.config.append((key.removeprefix("config.").split("."), value))
    return out


def set_config_path(config: run.Config, path: list[str], value) -> None:
    """Set `value` at a dotted path of a `run.Config` tree (list items by index)."""
    node = config
    where = []
    for part in path[:-1]:
        where.append(part)
        node = _child(node, part, ".".join(where))
    last = path[-1]
    if isinstance(node, list):
        node[_index(node, last, ".".join(path))] = value
        return
    if not isinstance(node, fdl.Buildable):
        raise ValueError(f"config override {'.'.join(path)!r}: {'.'.join(where)!r} is not a config section")
    if last not in fdl.ordered_arguments(node, include_defaults=True):
        known = sorted(fdl.ordered_arguments(node, include_defaults=True))
        raise ValueError(f"config override {'.'.join(path)!r}: {fdl.get_callable(node).__name__} has no field "
                         f"{last!r}; known: {known}")
    setattr(node, last, value)


def _index(node: list, part: str, key: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ValueError(f"config override {key!r}: {part!r} is not an index of a list of {len(node)}")
    return int(part)


def _child(node, part: str, key: str):
    if isinstance(node, list):
        return node[_index(node, part, key)]
    if isinstance(node, fdl.Buildable) and part in fdl.ordered_arguments(node, include_defaults=True):
        child = getattr(node, part)
        if isinstance(child, (fdl.Buildable, list)):
            return child
    raise ValueError(f"config override {key!r}: no config section named {part!r}")


def build(name: str, items: list[str] = (), extra_params: dict | None = None) -> tuple[run.Partial, Overrides]:
    """The recipe `name` with overrides applied and validated; also returns the executor overrides."""
    recipe = registry.get(name)
    overrides = split_overrides(recipe, list(items))
    partial = recipe.build(**{**overrides.recipe, **(extra_params or {})})
    for path, value in overrides.config:
        set_config_path(partial.config, path, value)
    validate(partial)
    return partial, overrides
