"""Typed dataclass configs <-> plain dicts / JSON / YAML files, and `key=value` command-line overrides."""
from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints


def to_dict(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


class NotFiniteError(ValueError):
    """A float field holding NaN or an infinity (JSON's NaN/Infinity, YAML's .nan/.inf, Python's float('nan'))."""


def _convert(value: Any, hint: Any, where: str) -> Any:
    origin = get_origin(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _convert(value, option, where)
            except NotFiniteError:
                raise  # its own message, not lost among the other options'
            except (TypeError, ValueError) as err:
                errors.append(str(err))
        raise ValueError(f"{where}: {value!r} fits none of {hint}: {'; '.join(errors)}")
    if origin is typing.Literal:
        if value not in get_args(hint):
            raise ValueError(f"{where}: {value!r} is not one of {list(get_args(hint))}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{where}: expected a list, got {value!r}")
        (item,) = get_args(hint)[:1] or (Any,)
        return [_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise TypeError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        return from_dict(hint, value, where)
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        # NaN passes every `x <= 0` style check after it (all comparisons with it are false): refused here, by name
        if not math.isfinite(value):
            raise NotFiniteError(f"{where}: must be a finite number, got {value!r}")
        return float(value)
    if hint is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if hint in (str, bool) and isinstance(value, hint):
        return value
    raise TypeError(f"{where}: expected {getattr(hint, '__name__', hint)}, got {value!r}")


def from_dict(cls, data: dict, where: str = "") -> Any:
    """Build dataclass `cls` from a dict, converting nested dataclasses; unknown keys are errors."""
    if not isinstance(data, dict):
        raise TypeError(f"{where or cls.__name__}: expected a mapping, got {data!r}")
    if hasattr(cls, "coerce"):
        data = cls.coerce(data)
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"{where or cls.__name__}: unknown field(s) {sorted(unknown)}; known: {sorted(names)}")
    kwargs = {k: _convert(v, hints[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    return cls(**kwargs)


def check_fields(obj: Any, where: str = "") -> None:
    """Refuse, naming the field, any value of a built dataclass tree that `from_dict` would not take: a wrong type
    (a float where an int belongs: `1e12` parses as a float) or a non-finite float. A config built another way than
    `from_dict` (recipes build it with fiddle, which checks no types) gets the same checks; nested dataclasses and
    lists of them are walked."""
    hints = get_type_hints(type(obj))
    for item in dataclasses.fields(obj):
        name = f"{where}.{item.name}" if where else item.name
        value = getattr(obj, item.name)
        if dataclasses.is_dataclass(value):
            check_fields(value, name)
        elif isinstance(value, (list, tuple)) and any(dataclasses.is_dataclass(v) for v in value):
            for index, child in enumerate(value):
                check_fields(child, f"{name}[{index}]")
        else:
            _convert(value, hints[item.name], name)


def parse_value(text: str) -> Any:
    """A command-line value: JSON when it parses (numbers, true/false/null, lists), else the raw string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply `a.b.c=value` (list items by index: `phases.1.steps=100`) to a nested dict, returning a copy."""
    data = json.loads(json.dumps(data))
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not of the form key=value")
        key, raw = item.split("=", 1)
        parts = key.split(".")
        node = data
        for depth, part in enumerate(parts[:-1]):
            node = _child(node, part, ".".join(parts[: depth + 1]))
        last = parts[-1]
        if isinstance(node, list):
            node[_index(node, last, key)] = parse_value(raw)
        else:
            node[last] = parse_value(raw)
    return data


def _index(node: list, part: str, key: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ValueError(f"override {key!r}: {part!r} is not an index of a list of {len(node)}")
    return int(part)


def _child(node, part: str, key: str):
    if isinstance(node, list):
        return node[_index(node, part, key)]
    if not isinstance(node, dict):
        raise ValueError(f"override {key!r}: cannot descend into {node!r}")
    if node.get(part) is None:
        node[part] = {}
    return node[part]


# A config a person writes is a few kB and a few hundred values. YAML's aliases let 500 bytes stand for billions of
# values (each alias repeats a subtree, nested 9 deep: the "billion laughs"): `yaml.safe_load` shares the subtrees,
# but the overrides' JSON copy and `to_dict` expand them. Refused past these bounds, before anything expands them.
CONFIG_FILE_LIMIT = 4 * 1024 * 1024
CONFIG_VALUE_LIMIT = 100_000


class ConfigFileError(ValueError):
    """A config file that cannot be taken: too large, a cycle, or more values than any config holds."""


def load_file(path: str | Path) -> dict:
    from mlmclm.bounded_read import FileRefusedError, read_regular_text

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"config file {path} does not exist")
    try:
        text = read_regular_text(path, CONFIG_FILE_LIMIT, "config file")
    except FileRefusedError as err:
        raise ConfigFileError(str(err)) from None
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(text) or {}
        check_expanded_size(data, str(path))
        return data
    return json.loads(text)


def check_expanded_size(data: Any, source: str, limit: int = CONFIG_VALUE_LIMIT) -> None:
    """Refuse `data` if, with every shared (aliased) subtree counted each time it appears, it holds more than `limit`
    values, or if it contains itself (a recursive alias). Stops counting at the limit: cheap on any input."""
    count = 0
    stack = [(data, ())]
    while stack:
        node, ancestors = stack.pop()
        count += 1
        if count > limit:
            raise ConfigFileError(f"{source}: refused: it expands to more than {limit} values (YAML aliases repeat "
                                  "their subtree each time they appear); no config needs that many")
        if isinstance(node, (dict, list)):
            if id(node) in ancestors:
                raise ConfigFileError(f"{source}: refused: a YAML alias refers to a value that contains it (a cycle)")
            children = node.values() if isinstance(node, dict) else node
            inner = ancestors + (id(node),)
            stack.extend((child, inner) for child in children)
