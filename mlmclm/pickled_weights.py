"""Reading a pickled weight file (`pytorch_model.bin`) from others: plain tensors, or a one-line refusal.

torch's weights-only loader already refuses a pickle that would run code, but its error is a traceback that
advises re-running with `weights_only=False` — the one thing that runs the attacker's code. A legacy file (torch's
pre-zip format) fails differently: `mmap` is refused with a RuntimeError, and one that pickled a numpy scalar
beside its tensors gets the same advice. Here a legacy file is read without mmap, and any refusal becomes a
PickledWeightsError (a ValueError: one line, exit 2 from the tools) naming the file and what its pickle asked for,
advising only safetensors.
"""
from __future__ import annotations

import pickle
import re
from pathlib import Path


class PickledWeightsError(ValueError):
    """A pickled weight file that holds more than plain tensors, or is no torch file at all."""


def _what_it_asked(err: BaseException) -> str:
    found = re.search(r"unsupported GLOBAL (\S+)|Unsupported global: GLOBAL (\S+)", str(err))
    return (f"its pickle asks for {found.group(1) or found.group(2)}, which is not a tensor" if found
            else "its pickle holds more than plain tensors")


def load_plain_tensors(path: str | Path) -> dict:
    """The tensors of a torch-pickled weight file, loaded on CPU with torch's weights-only unpickler (memory-mapped
    when the file's format allows)."""
    import torch

    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as err:
            if "mmap can only be used" not in str(err):
                raise
            return torch.load(path, map_location="cpu", weights_only=True)  # the legacy format: read whole
    except pickle.UnpicklingError as err:
        raise PickledWeightsError(f"{path}: refused: {_what_it_asked(err)}; only plain tensors are read from a "
                                  f"pickled weight file (nothing in it ran): use the model's safetensors "
                                  f"weights") from None
    except (RuntimeError, EOFError, OSError) as err:
        raise PickledWeightsError(f"{path}: not a readable torch weight file ({type(err).__name__}: "
                                  f"{str(err).splitlines()[0] if str(err) else ''})") from None
