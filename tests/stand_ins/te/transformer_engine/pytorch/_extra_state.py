"""TE >= 2.18's refusal of pickled extra state (`transformer_engine/pytorch/_extra_state.py`, read at TE's 2.20
development head; written here from that reading, not copied).

The rule `set_extra_state` applies to a non-empty byte payload before it unpickles it, decided from the pickle's
opcodes without running it:
- a payload importing no global and naming none of delayed scaling's keys (`scale_fwd`, `amax_history_fwd`,
  `scale_bwd`, `amax_history_bwd`) is ignored (nothing loaded);
- a payload without a `recipe` key (TE 1.x), one that imports `transformer_engine.common.recipe.DelayedScaling`,
  one naming a delayed-scaling key, or one importing no known recipe class is loaded only when
  `NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1` (read at every call), else RuntimeError with TE's advisory;
- a payload whose recipes are all stateless (current scaling, MXFP8, block scaling, NVFP4) is ignored;
- a payload whose opcodes cannot be read counts as one to load only with the opt-in.
A `BytesIO` (the older format) is always unsafe: refused without the opt-in.
"""
from __future__ import annotations

import os
import pickletools

UNSAFE_PICKLE_EXTRA_STATE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"
_RECIPES = "transformer_engine.common.recipe"
DELAYED_SCALING_KEYS = frozenset({"scale_fwd", "amax_history_fwd", "scale_bwd", "amax_history_bwd"})
STATEFUL = {(_RECIPES, "DelayedScaling")}
STATELESS = {(_RECIPES, name) for name in ("Float8CurrentScaling", "MXFP8BlockScaling", "Float8BlockScaling",
                                           "NVFP4BlockScaling")}
DYNAMIC = {(_RECIPES, "CustomRecipe")}
_STRING_OPCODES = {"STRING", "BINSTRING", "SHORT_BINSTRING", "UNICODE", "BINUNICODE", "BINUNICODE8",
                   "SHORT_BINUNICODE"}


def unsafe_pickle_extra_state_enabled() -> bool:
    return os.getenv(UNSAFE_PICKLE_EXTRA_STATE_ENV, "0") == "1"


def extra_state_pickle_advisory(context: str) -> str:
    return (f"Refusing to load pickled Transformer Engine extra state for {context}. Delayed-scaling FP8 metadata "
            f"can be stored as a Python pickle, and loading it can execute arbitrary code. To load it anyway, set "
            f"{UNSAFE_PICKLE_EXTRA_STATE_ENV}=1.")


def needs_unpickling(data: bytes) -> bool:
    """True: the payload must be unpickled (only with the opt-in); False: TE ignores it."""
    if not data:
        return False
    try:
        texts, imports = [], []
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name in _STRING_OPCODES:
                text = arg.decode("utf-8", "replace") if isinstance(arg, bytes) else arg
                texts.append(text)
            elif opcode.name == "GLOBAL":
                imports.append(tuple(str(arg).split(" ", 1)) if " " in str(arg) else None)
            elif opcode.name == "STACK_GLOBAL":
                imports.append(tuple(texts[-2:]) if len(texts) >= 2 else None)
    except Exception:
        return True
    names = set(texts)
    delayed_keys = bool(names & DELAYED_SCALING_KEYS)
    if not imports and not delayed_keys:
        return False
    known = {ref for ref in imports if ref in STATEFUL | STATELESS | DYNAMIC}
    if "recipe" not in names or known & STATEFUL or delayed_keys or not known:
        return True
    return False


def should_load_extra_state_pickle(data: bytes, context: str) -> bool:
    if not needs_unpickling(data):
        return False
    if unsafe_pickle_extra_state_enabled():
        return True
    raise RuntimeError(extra_state_pickle_advisory(context))
