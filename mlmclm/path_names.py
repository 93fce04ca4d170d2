"""Names from others that become one component of a path (a model label, a task name) stay one component.

`runs/<label>/<task>/...` with a label or task named `..` (or `a/../..`) would put the record outside the output
folder; a name with a NUL cannot be a path at all; a name longer than a file system takes (300 characters: the
fine-tune ran, then its record could not be written, "File name too long", and the work was lost). Such a name is
refused, naming what it is, before anything is written or run.
"""
from __future__ import annotations

# The longest file name Linux's and macOS's file systems take (NAME_MAX), in bytes of its UTF-8 encoding.
NAME_MAX_BYTES = 255


def check_path_component(value, what: str) -> str:
    """`value` if it is usable as one path component: non-empty text without '/', '\\' or NUL, not '.' or '..', at
    most NAME_MAX_BYTES long (ValueError naming `what` otherwise). Spaces and any other characters are kept: they
    stay inside the folder."""
    if not isinstance(value, str) or not value or value in (".", "..") or any(c in value for c in "/\\\0"):
        raise ValueError(f"{what} must be one plain name (non-empty, no '/', '\\' or NUL, not '.' or '..'): it "
                         f"becomes a folder of the output, got {value!r}")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > NAME_MAX_BYTES:
        raise ValueError(f"{what} is {size} bytes long, more than the {NAME_MAX_BYTES} a file name may hold (it "
                         f"becomes a folder of the output): {value[:40]!r}...")
    return value
