"""An output is never one of its own inputs, inside one, or around one.

`convert_to_hf RUN RUN --force` replaced the whole training run with the export, and `convert_from_hf HF HF --force`
deleted its source before reading it: a tool that replaces its output (or writes into it) must first know that the
output and what it reads are apart. Checked on resolved paths (a link to the input is the input), before anything is
read, written or deleted.
"""
from __future__ import annotations

from pathlib import Path


class OutputOverlapError(ValueError):
    """The output is an input, lies inside one, or holds one."""


def check_output_apart(output: str | Path, inputs: dict[str, str | Path | None]) -> None:
    """Refuse (one line naming both paths) an `output` that is, lies inside, or holds one of `inputs` (what the
    input is -> its path; None and paths that do not exist are skipped)."""
    out = Path(output).resolve()
    for what, given in inputs.items():
        if given is None or not Path(given).exists():
            continue
        source = Path(given).resolve()
        if out == source:
            relation = "is"
        elif source in out.parents:
            relation = "is inside"
        elif out in source.parents:
            relation = "holds"
        else:
            continue
        raise OutputOverlapError(f"output {output} {relation} the {what} {given}: writing it would replace or mix "
                                 f"with what is read; choose an output outside it")
