"""Names from others that become part of a path, or a word of a shell command, stay what they were meant to be.

- One path component (`check_path_component`: an evaluation model label, a task name): `runs/<label>/<task>/...`
  with a label or task named `..` (or `a/../..`) would put the record outside the output folder; a name with a NUL
  cannot be a path at all; a name longer than a file system takes (300 characters: the fine-tune ran, then its
  record could not be written, "File name too long", and the work was lost).
- A plain name (`PLAIN_NAME`, `check_plain_name`: a phase, `logging.run_name`, an experiment's title, a dataset's
  shard): one component that also means nothing to a shell or a URL, for names that NeMo-Run splices unquoted into
  `mkdir -p {path}` and the sbatch script's lines, or a manifest splices into a `pipe:` command.
- A shell word (`check_shell_word`: the Slurm executor's folders, image and mounts): a path that the sbatch script
  or NeMo-Run's `mkdir -p` holds unquoted stays one word that runs nothing.

Such a name is refused, naming what it is, before anything is written.
"""
from __future__ import annotations

import re

# The longest file name Linux's and macOS's file systems take (NAME_MAX), in bytes of its UTF-8 encoding.
NAME_MAX_BYTES = 255

# No space, quote, $, ;, |, &, <, >, `, *, ?, ~, newline (shell), no %, #, @, : (URL), never empty, never starting
# with "." (so never "." or "..") or "-" (an option to a command), at most 255 characters (a folder's limit).
PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")
PLAIN_NAME_RULE = "letters, digits, '.', '_', '-'; not starting with '.' or '-'; at most 255"


def is_plain_name(value) -> bool:
    return isinstance(value, str) and PLAIN_NAME.fullmatch(value) is not None


def check_plain_name(value, what: str, use: str) -> str:
    """`value` if it is a plain name, else a one-line ValueError naming `what` (a field, a flag), the rule, what the
    name is used for (`use`) and the value."""
    if not is_plain_name(value):
        raise ValueError(f"{what} must be a plain name ({PLAIN_NAME_RULE}; {use}), got {value!r}")
    return value


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


# What a path may hold to stay one inert word of a shell line: no space, quote, $, ;, |, &, <, >, `, *, ?, ( ), { },
# backslash or newline; "#" and "%" only inside a word (an enroot image is `nvcr.io#nvidia/pytorch:26.06-py3`), never
# a leading "-" (an option) or "~" (a home directory the shell would substitute).
SHELL_WORD = re.compile(r"[A-Za-z0-9_./:+,=@][A-Za-z0-9_./:+,=@#%-]*")
SHELL_WORD_RULE = "letters, digits and . _ / : + , = @ - (# and % inside), no space"


def check_shell_word(value, what: str) -> str:
    """`value` if a shell reading it unquoted sees one word with nothing to run or expand, else a one-line
    ValueError naming `what` and the value."""
    if not isinstance(value, str) or SHELL_WORD.fullmatch(value) is None:
        raise ValueError(f"{what} must be a path of {SHELL_WORD_RULE} (NeMo-Run and the sbatch script use it "
                         f"unquoted in shell lines), got {value!r}")
    return value
