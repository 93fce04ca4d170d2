"""No remote-code hook of a source travels into a directory we write (HF export, sentence-transformers layout, kept
retriever, the tokenizer a checkpoint carries).

We load every source without remote code, but `transformers` saves what it read: a tokenizer's `auto_map` and
`custom_pipelines` come back out of `save_pretrained`, and so does a config's. Whoever loads our output with
`trust_remote_code=True` (EuroBERT's own model card asks for it) would then run the classes the source named. So
every writer calls `strip_remote_code_hooks` on what it wrote, before publishing it:

- `auto_map` and `custom_pipelines` are removed from every JSON file of the directory (its top level, where
  `transformers` reads them; the token tables of a tokenizer are left alone, such a key there is a token);
- a `tokenizer_class` that `transformers` does not ship is replaced by a native one: the class `transformers` saved
  for the tokenizer we loaded (tokenizer_config.json's, native since nothing else can load), else `TokenizersBackend`
  where a tokenizer.json is there (the class transformers 5 itself reads any tokenizer.json with). Where neither
  applies (no native class could read the files), the directory is refused rather than written pointing at code.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

from mlmclm.atomic_write import write_atomic
from mlmclm.bounded_read import read_regular_text

log = logging.getLogger(__name__)

HOOK_KEYS = ("auto_map", "custom_pipelines")  # each names classes or modules to import from the model's repository
TOKENIZER_CONFIG = "tokenizer_config.json"
# token -> id tables, where such a key is a token of the vocabulary, never a hook (transformers reads none there)
TOKEN_TABLES = ("tokenizer.json", "vocab.json", "added_tokens.json")
FALLBACK_TOKENIZER_CLASS = "TokenizersBackend"


class RemoteCodeHookError(ValueError):
    """A written directory would need remote code and no native class can stand in."""


def is_native_tokenizer_class(name) -> bool:
    """Whether `transformers` ships a tokenizer class of that name (looked up in its own tables, importing only its
    own modules; a name of something else it ships, `AutoModel`, is no tokenizer class)."""
    from transformers import PreTrainedTokenizerBase
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    found = tokenizer_class_from_name(name) if isinstance(name, str) and name else None
    return isinstance(found, type) and issubclass(found, PreTrainedTokenizerBase)


def _native_replacement(directory: Path) -> str | None:
    saved = directory / TOKENIZER_CONFIG
    if saved.is_file():
        name = json.loads(read_regular_text(saved, what="tokenizer config")).get("tokenizer_class")
        if is_native_tokenizer_class(name):
            return name
    return FALLBACK_TOKENIZER_CLASS if (directory / "tokenizer.json").is_file() else None


def _strip(config: dict, replacement, removed: list[str]) -> dict:
    """`config` without hook keys and with a native tokenizer class, recording each change in `removed`. Only the
    top level: it is where `transformers` reads them (a nested `auto_map` is never acted on)."""
    out = {}
    for key, item in config.items():
        if key in HOOK_KEYS:
            removed.append(key)
            continue
        if key == "tokenizer_class" and item is not None and not is_native_tokenizer_class(item):
            native = replacement()
            if native is None:
                raise RemoteCodeHookError(f"tokenizer class {item!r} is not one transformers ships, and no native "
                                          f"class can read this tokenizer (no tokenizer.json): refusing to write a "
                                          f"model that would need remote code to load")
            removed.append(f"tokenizer_class {item!r} (now {native!r})")
            item = native
        out[key] = item
    return out


def strip_remote_code_hooks(directory: Path) -> list[str]:
    """Remove remote-code hooks from every JSON file under `directory` (see the module); returns what was changed,
    as `file: key` lines (also logged), empty when the directory held none."""
    directory = Path(directory)
    changes = []
    cached: list[str | None] = []

    def replacement() -> str | None:  # read once, and only when a foreign class is met
        if not cached:
            cached.append(_native_replacement(directory))
        return cached[0]

    for path in sorted(directory.rglob("*.json")):
        if path.name in TOKEN_TABLES:
            continue
        text = read_regular_text(path, what="JSON file")
        if not any(key in text for key in (*HOOK_KEYS, "tokenizer_class")):
            continue  # most files (the weights' index, our records) hold none: left byte for byte
        config = json.loads(text)
        if not isinstance(config, dict):
            continue
        removed: list[str] = []
        try:
            cleaned = _strip(config, replacement, removed)
        except RemoteCodeHookError as err:
            raise RemoteCodeHookError(f"{path}: {err}") from None
        if removed:
            write_atomic(path, json.dumps(cleaned, indent=2, ensure_ascii=False) + "\n")
            rel = path.relative_to(directory)
            changes += [f"{rel}: {what}" for what in removed]
    if changes:
        log.warning("left out of %s, remote-code hooks the source carried: %s", directory, "; ".join(changes))
    return changes
