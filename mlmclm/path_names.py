"""Names from others that become one component of a path (a model label, a task name) stay one component.

`runs/<label>/<task>/...` with a label or task named `..` (or `a/../..`) would put the record outside the output
folder; a name with a NUL cannot be a path at all. Such a name is refused, naming what it is, before anything is
written.
"""
from __future__ import annotations


def check_path_component(value, what: str) -> str:
    """`value` if it is usable as one path component: non-empty text without '/', '\\' or NUL, not '.' or '..'
    (ValueError naming `what` otherwise). Spaces and any other characters are kept: they stay inside the folder."""
    if not isinstance(value, str) or not value or value in (".", "..") or any(c in value for c in "/\\\0"):
        raise ValueError(f"{what} must be one plain name (non-empty, no '/', '\\' or NUL, not '.' or '..'): it "
                         f"becomes a folder of the output, got {value!r}")
    return value
