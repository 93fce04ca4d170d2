"""Embedded smoke tasks of all four families, derived with real labels from the embedded corpus (offline, deterministic).

Built from four plays whose Gutenberg text marks each speech with an upper-case speaker line (`MACBETH.`):
- `smoke_which_play` (classification): a speech (8-40 words) -> the play it comes from (4 classes).
- `smoke_speaker_names` (token classification): the words of a speech, names of the play's speakers tagged `B-PER`
  (single-word names, generic roles such as LORD or SERVANT excluded).
- `smoke_who_says` (extractive QA): a passage of four consecutive speeches in `SPEAKER. text` form and the question
  `Who says "<opening words>"?`; the answer is the speaker label in the passage. One question in four quotes a speech
  from elsewhere in the play and is unanswerable.
- `smoke_next_line` (retrieval): a speech as query, the speech that follows it as the one relevant passage.
They are a smoke test of the pipeline, not a benchmark of record.
"""
from __future__ import annotations

import functools
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from mlmclm.eval.tasks import TaskSpec

SMOKE_PLAYS = ("macbeth_gut", "tempest_gut", "twelfth_night_gut", "othello_gut")
_SPEAKER_LINE = re.compile(r"^([A-Z][A-Z'\- ]{1,30}[A-Z])\.\s*$")
_NOT_SPEAKERS = re.compile(r"^(ACT|SCENE|PERSONS|EPILOGUE|PROLOGUE)\b")
_STAGE_DIRECTION = re.compile(r"\[[^\]]*\]")
_WORD = re.compile(r"[A-Za-z]+(?:['\-][A-Za-z]+)*|[^\sA-Za-z]")
_GENERIC_ROLES = {"ALL", "BOTH", "LORD", "LORDS", "LADY", "KING", "QUEEN", "DUKE", "SERVANT", "MESSENGER", "CLOWN",
                  "CAPTAIN", "DOCTOR", "PORTER", "SOLDIER", "MASTER", "PRIEST", "HERALD", "SAILOR", "GENTLEWOMAN",
                  "ATTENDANT", "APPARITION", "MARINERS", "GENTLEMEN", "MURDERER", "OFFICER", "BOATSWAIN"}


@dataclass(frozen=True)
class Speech:
    play: str
    scene: int
    speaker: str
    text: str


@dataclass(frozen=True)
class SmokeSizes:
    train: int = 160
    validation: int = 48
    test: int = 48

    def __post_init__(self) -> None:
        if min(self.train, self.validation, self.test) < 4:
            raise ValueError(f"smoke split sizes must be >= 4, got {self}")


def parse_speeches(key: str, text: str) -> list[Speech]:
    """Speeches in order: a speaker line, then its non-blank lines (stage directions dropped)."""
    speeches: list[Speech] = []
    scene, speaker, lines = 0, None, []

    def flush():
        body = " ".join(_STAGE_DIRECTION.sub(" ", " ".join(lines)).split())
        if speaker and body:
            speeches.append(Speech(key, scene, speaker, body))

    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("SCENE") or line.startswith("ACT "):
            flush(); speaker, lines = None, []
            scene += line.startswith("SCENE")
        elif (match := _SPEAKER_LINE.match(line)) and not _NOT_SPEAKERS.match(line):
            flush(); speaker, lines = match.group(1), []
        elif not line:
            flush(); speaker, lines = None, []
        elif speaker:
            lines.append(line)
    flush()
    return speeches


def _words(text: str, limit: int) -> str:
    return " ".join(text.split()[:limit])


def _split(rows: list, sizes: SmokeSizes, seed: int) -> dict[str, list]:
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    needed = sizes.train + sizes.validation + sizes.test
    if len(rows) < needed:
        raise ValueError(f"smoke task needs {needed} examples but the corpus yields {len(rows)}")
    return {"train": rows[:sizes.train], "validation": rows[sizes.train:sizes.train + sizes.validation],
            "test": rows[sizes.train + sizes.validation:needed]}


@functools.lru_cache(maxsize=1)  # reading and parsing the corpus is the slow part
def _load_plays() -> dict[str, tuple[str, list[Speech]]]:
    from mlmclm.data.corpus import load_works

    works = {w.key: w for w in load_works()}
    plays = {}
    for key in SMOKE_PLAYS:
        if key not in works:
            raise ValueError(f"smoke tasks need play {key!r}, missing from the embedded corpus")
        speeches = parse_speeches(key, works[key].text)
        if len(speeches) < 200:
            raise ValueError(f"smoke tasks: only {len(speeches)} speeches parsed from {key!r}; has its format changed?")
        plays[key] = (works[key].title, speeches)
    return plays


def which_play_rows(plays) -> list[dict]:
    return [{"text": _words(s.text, 40), "label": title} for title, speeches in plays.values()
            for s in speeches if len(s.text.split()) >= 8]


def speaker_name_rows(plays) -> list[dict]:
    rows = []
    for _, speeches in plays.values():
        names = {s.speaker.lower() for s in speeches if " " not in s.speaker and s.speaker not in _GENERIC_ROLES}
        for s in speeches:
            tokens = _WORD.findall(_words(s.text, 40))
            tags = ["B-PER" if t.lower() in names and t[0].isupper() else "O" for t in tokens]
            if "B-PER" in tags:
                rows.append({"tokens": tokens, "tags": tags})
    return rows


def who_says_rows(plays, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _, speeches in plays.values():
        for start in range(0, len(speeches) - 4, 4):
            window = speeches[start:start + 4]
            if len({s.scene for s in window}) != 1:
                continue
            parts, label_starts, offset = [], [], 0
            for s in window:
                label_starts.append(offset)
                part = f"{s.speaker}. {_words(s.text, 25)}"
                parts.append(part)
                offset += len(part) + 1
            context = "\n".join(parts)
            index = len(rows)
            if rng.random() < 0.25:  # a speech from another window: unanswerable here
                other = speeches[(start + 4 + rng.randrange(len(speeches) - 8)) % len(speeches)]
                quote = _words(other.text, 8)
                if quote in context:
                    continue
                answers = {"text": [], "answer_start": []}
            else:
                pick = rng.randrange(4)
                quote = _words(window[pick].text, 8)
                answers = {"text": [window[pick].speaker], "answer_start": [label_starts[pick]]}
            rows.append({"id": f"who{index}", "question": f'Who says "{quote}"?', "context": context,
                         "answers": answers})
    return rows


def next_line_rows(plays) -> list[dict]:
    rows = []
    for _, speeches in plays.values():
        for current, following in zip(speeches, speeches[1:]):
            if current.scene == following.scene and len(current.text.split()) >= 5:
                rows.append({"query": _words(current.text, 20), "positives": [_words(following.text, 30)]})
    return rows


def write_smoke_tasks(output_dir: Path, sizes: SmokeSizes = SmokeSizes(), seed: int = 0,
                      max_length: int = 128) -> list[TaskSpec]:
    """Write the four smoke tasks as JSONL folders under `output_dir`; return their specs."""
    plays = _load_plays()
    builders = {
        "smoke_which_play": ("classification", which_play_rows(plays)),
        "smoke_speaker_names": ("token_classification", speaker_name_rows(plays)),
        "smoke_who_says": ("qa", who_says_rows(plays, seed)),
        "smoke_next_line": ("retrieval", next_line_rows(plays)),
    }
    specs = []
    for name, (family, rows) in builders.items():
        folder = Path(output_dir) / name
        folder.mkdir(parents=True, exist_ok=True)
        for split, split_rows in _split(rows, sizes, seed).items():
            tmp = folder / f"{split}.jsonl.tmp"
            tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in split_rows), encoding="utf-8")
            tmp.replace(folder / f"{split}.jsonl")
        specs.append(TaskSpec(name=name, family=family, path=str(folder), max_length=max_length))
    return specs
