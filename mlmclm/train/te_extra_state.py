"""Transformer Engine's `_extra_state` (its FP8 metadata, a pickle) loaded without running stored code.

`safe_extra_state` decodes each payload with the allow-list unpickler and hands TE a re-pickled copy of what it
decoded; `load_vetted_state` sets TE >= 2.18's pickle opt-in for the one `load_state_dict` call that hands TE those
copies, only when every payload in it is one of them (mlmclm.train.checkpoint_guard says why)."""
from __future__ import annotations

import contextlib
import io
import os
import pickle

import torch

from mlmclm.train.safe_unpickle import STORAGE_FROM_BYTES, AllowListUnpickler, UnsafeCheckpointError, weights_only_load

# A TE extra state is a plain pickle (TE's `get_extra_state`) of a dict of CPU tensors, numbers and, in TE 2.x, the FP8
# recipe. Plain pickle stores a tensor as `_rebuild_tensor_v2` over a storage that `_load_from_bytes` reads with
# torch.load (megatron swaps in its weights-only `safe_load_from_bytes` at import; both are routed to ours). The recipe
# classes are the ones megatron-core 0.19's own extra-state unpickler (`megatron.core.safe_globals`) accepts.
_TE_RECIPE = "transformer_engine.common.recipe"
_EXTRA_STATE_GLOBALS = frozenset({
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._tensor", "_rebuild_from_type_v2"),
    ("torch.storage", "UntypedStorage"),
    ("torch", "Size"),
    ("collections", "OrderedDict"),
    *((_TE_RECIPE, name) for name in ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling",
                                      "MXFP8BlockScaling", "NVFP4BlockScaling", "Format", "_FormatHelper",
                                      "MMParams", "QParams")),
    ("megatron.core.extensions.transformer_engine", "TEDelayedScaling"),
    *(("builtins", name) for name in ("dict", "list", "tuple", "int", "float", "bool", "bytes", "str")),
})

def safe_extra_state(value, source: str):
    """A TE `_extra_state` value that TE's own loader can unpickle without running stored code.

    TE's `set_extra_state` (2.x) and megatron's `_decode_extra_state` unpickle `state.numpy().tobytes()` of a tensor
    of *any* dtype, so every non-empty tensor is vetted whatever its dtype: its bytes, read as they do, are decoded
    with the allow-list and re-pickled from what was decoded into the uint8 tensor TE writes. BytesIO (older TE) is
    read and re-saved with torch's weights-only loader. A payload that does not decode is refused, not passed on: TE
    would `pickle.loads` it unvetted, and its reader need not fail where ours did (a storage ours could not read
    weights-only is one TE's `torch.load` reads in full). Any other type is refused (TE and megatron know none). The
    one exception: an allow-listed class that cannot be imported here, where any reader fails at the same import;
    the payload goes on as it is.
    """
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.numel() == 0:
            return value  # megatron's local layers and TE without FP8: nothing is unpickled
        data = _bytes_as_te_reads_them(value, source)
        try:
            decoded = AllowListUnpickler(data, source, _EXTRA_STATE_GLOBALS | STORAGE_FROM_BYTES).load()
        except UnsafeCheckpointError:
            raise
        except (ImportError, AttributeError):
            # An allow-listed class this install lacks (TE's recipe without TE: a TE run exported on CPU). TE's own
            # unpickler, if TE is here at all, stops at the same import, having run only what ours vetted before it.
            return value
        except Exception as err:
            raise UnsafeCheckpointError(f"{source}: refused: this Transformer Engine extra state does not decode as "
                                        f"the FP8 metadata TE writes ({type(err).__name__}: {err}); it is truncated, "
                                        "corrupt or not TE's") from None
        return _vetted(torch.frombuffer(bytearray(pickle.dumps(decoded)), dtype=torch.uint8))
    if isinstance(value, io.BytesIO):
        value.seek(0)
        decoded = weights_only_load(value, source)
        fresh = io.BytesIO()
        torch.save(decoded, fresh)
        fresh.seek(0)
        return _vetted(fresh)
    raise UnsafeCheckpointError(f"{source}: refused: a Transformer Engine extra state is a byte tensor or a BytesIO; "
                                f"this one is {type(value).__name__}, which no TE or megatron version writes")


def _bytes_as_te_reads_them(value: torch.Tensor, source: str) -> bytes:
    """`value.detach().cpu().numpy().tobytes()`, TE's and megatron's reading; a dtype numpy cannot hold (bf16, FP8)
    makes their reader fail before any unpickling, and is refused here with that reason."""
    try:
        return value.detach().cpu().numpy().tobytes()
    except (TypeError, RuntimeError) as err:
        raise UnsafeCheckpointError(f"{source}: refused: this Transformer Engine extra state is a {value.dtype} "
                                    f"tensor, which TE's reader cannot turn into bytes ({err})") from None


# The extra states `safe_extra_state` wrote (by identity, held until `load_vetted_state` hands them over).
_VETTED: dict[int, object] = {}
UNSAFE_PICKLE_EXTRA_STATE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"  # TE >= 2.18's opt-in, read per call


def _vetted(value):
    _VETTED[id(value)] = value
    return value


def _carries_a_pickle(value) -> bool:
    """What TE's `set_extra_state` would unpickle: a non-empty byte tensor, or a BytesIO."""
    return isinstance(value, io.BytesIO) or (isinstance(value, torch.Tensor) and value.numel() > 0)


@contextlib.contextmanager
def _te_pickle_opt_in():
    before = os.environ.get(UNSAFE_PICKLE_EXTRA_STATE_ENV)
    os.environ[UNSAFE_PICKLE_EXTRA_STATE_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[UNSAFE_PICKLE_EXTRA_STATE_ENV]
        else:
            os.environ[UNSAFE_PICKLE_EXTRA_STATE_ENV] = before


def load_vetted_state(module: torch.nn.Module, state: dict):
    """`module.load_state_dict(state, strict=False)`, with TE's pickle opt-in set for exactly this call when every
    extra state TE would unpickle is a copy `safe_extra_state` wrote (then TE unpickles only our bytes). If any is
    not, the opt-in stays as it was and TE's own refusal applies to it. Synchronous, on the loading thread: no
    other reader of the variable runs meanwhile (checkpoint saves are synchronous too)."""
    pickles = [v for k, v in state.items() if k.endswith("_extra_state") and _carries_a_pickle(v)]
    all_vetted = all(id(v) in _VETTED and _VETTED[id(v)] is v for v in pickles)
    try:
        if pickles and all_vetted:
            with _te_pickle_opt_in():
                return module.load_state_dict(state, strict=False)
        return module.load_state_dict(state, strict=False)
    finally:
        for value in pickles:
            _VETTED.pop(id(value), None)
