"""A Hugging Face directory carrying someone else's remote-code hooks, and what a directory we wrote still carries.

The hooks are what a hostile (or simply custom-code) repository ships, EuroBERT's own hub repository among them:
`auto_map` in config.json and tokenizer_config.json naming classes to import from a repository (`repo--module.Class`
fetches another repository's code), `custom_pipelines` in both, and a special_tokens_map.json beside them. The
tokenizer's class stays native, so `transformers` still loads the directory without remote code, as it loads such
repositories; that is how the hooks used to travel into our exports."""
from __future__ import annotations

import json
from pathlib import Path

HOOKS = {
    "auto_map": {"AutoConfig": "attacker/repo--evil.Config", "AutoModel": "attacker/repo--evil.Model",
                 "AutoTokenizer": ["attacker/repo--evil.Tokenizer", "attacker/repo--evil.Tokenizer"]},
    "custom_pipelines": {"fill-mask": {"impl": "attacker/repo--evil.Pipeline", "pt": ["AutoModelForMaskedLM"]}},
}
TOKEN_TABLES = ("tokenizer.json", "vocab.json", "added_tokens.json")  # token -> id maps: a key there is a token


def _add(path: Path, extra: dict) -> None:
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    path.write_text(json.dumps({**data, **extra}, indent=2), encoding="utf-8")


def plant_remote_code_hooks(directory: Path) -> Path:
    """Add the hooks to the model and tokenizer configs of `directory` (an HF model directory) and to a
    special_tokens_map.json; returns `directory`."""
    directory = Path(directory)
    for name in ("config.json", "tokenizer_config.json", "special_tokens_map.json"):
        if name != "config.json" or (directory / name).exists():
            _add(directory / name, HOOKS)
    return directory


def _is_native_tokenizer_class(name) -> bool:
    import transformers

    found = getattr(transformers, name, None) if isinstance(name, str) else None
    return isinstance(found, type) and issubclass(found, transformers.PreTrainedTokenizerBase)


def remote_code_hooks(directory: Path) -> list[str]:
    """Every hook left in the JSON files under `directory` (`file: key`), nested ones too; a tokenizer_class that
    transformers does not ship counts as one."""
    found = []

    def walk(value, where: str) -> None:
        if isinstance(value, list):
            for item in value:
                walk(item, where)
        elif isinstance(value, dict):
            for key, item in value.items():
                if key in HOOKS or (key == "tokenizer_class" and item is not None
                                    and not _is_native_tokenizer_class(item)):
                    found.append(f"{where}: {key}")
                walk(item, where)

    for path in sorted(Path(directory).rglob("*.json")):
        if path.name not in TOKEN_TABLES:
            walk(json.loads(path.read_text(encoding="utf-8")), str(path.relative_to(directory)))
    return found
