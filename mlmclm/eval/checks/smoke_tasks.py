"""Embedded smoke tasks of all four families, derived with real labels from the embedded corpus (offline, deterministic).

Built from four plays whose Gutenberg text marks each speech with an upper-case speaker line (`MACBETH.`):
- `smoke_which_play` (classification): a speech (8-40 words) -> the play it comes from (4 classes).
- `smoke_speaker_names` (token classification): the words of a speech, names of the play's speakers tagged `B-PER`
  (single-word names, generic roles such as LORD or SERVANT excluded).
- `smoke_named_character` (extractive QA): a speech and the question `Which character is named?`; the answer is
  the first mention of one of the play's speakers; one question in four has none and is unanswerable.
- `smoke_speech_halves` (retrieval): the first half of a speech (16-40 words) as query, its second half as the one
  relevant passage.
At the demo's size (4 layers, 128 wide) the two name tasks are learnt in 100 steps; which_play and speech_halves
stay near chance for every model (they check that the classification and retrieval paths run).
They are a smoke test of the pipeline, not a benchmark of record.
"""
from __future__ import annotations

import functools
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from mlmclm.atomic_write import write_atomic
from mlmclm.eval.finetune.task_spec import TaskSpec

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
    train: int = 1600  # a cap: tasks with fewer rows train on what is left after validation and test
    validation: int = 64
    test: int = 128

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
    """Validation and test of exactly their sizes; train takes up to `sizes.train` of the rest (at least as many
    as validation: a task the corpus cannot fill that far is refused)."""
    rows = list(rows)
    random.Random(seed).shuffle(rows)
    held = sizes.validation + sizes.test
    train = min(sizes.train, len(rows) - held)
    if train < min(sizes.train, sizes.validation):
        needed = held + min(sizes.train, sizes.validation)
        raise ValueError(f"smoke task needs {needed} examples but the corpus yields {len(rows)}")
    return {"validation": rows[:sizes.validation], "test": rows[sizes.validation:held], "train": rows[held:held + train]}


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


def _speaker_names(speeches: list[Speech]) -> set[str]:
    """Lower-cased single-word speaker names of a play, generic roles excluded."""
    return {s.speaker.lower() for s in speeches if " " not in s.speaker and s.speaker not in _GENERIC_ROLES}


def speaker_name_rows(plays) -> list[dict]:
    rows = []
    for _, speeches in plays.values():
        names = _speaker_names(speeches)
        for s in speeches:
            tokens = _WORD.findall(_words(s.text, 40))
            tags = ["B-PER" if t.lower() in names and t[0].isupper() else "O" for t in tokens]
            if "B-PER" in tags:
                rows.append({"tokens": tokens, "tags": tags})
    return rows


def named_character_rows(plays, seed: int) -> list[dict]:
    """A speech that names one of its play's speakers -> that name (its first mention); one speech in four names
    none of them and is unanswerable. Extractive like SQuAD-v2, learnable at smoke size (finding which capitalised
    word is a character needs no long-range matching, which a tiny model cannot learn in a hundred steps)."""
    answerable, unanswerable = [], []
    for _, speeches in plays.values():
        names = _speaker_names(speeches)
        for s in speeches:
            context = _words(s.text, 40)
            found = [m for m in _WORD.finditer(context) if m.group().lower() in names and m.group()[0].isupper()]
            if found:
                answerable.append((context, {"text": [found[0].group()], "answer_start": [found[0].start()]}))
            elif len(context.split()) >= 8:
                unanswerable.append((context, {"text": [], "answer_start": []}))
    picked = answerable + random.Random(seed).sample(unanswerable, min(len(unanswerable), len(answerable) // 3))
    return [{"id": f"named{i}", "question": "Which character is named?", "context": context, "answers": answers}
            for i, (context, answers) in enumerate(picked)]


def speech_halves_rows(plays) -> list[dict]:
    """The first half of a speech (16-40 words) as query, its second half as the one relevant passage."""
    rows = []
    for _, speeches in plays.values():
        for s in speeches:
            words = s.text.split()[:40]
            if len(words) >= 16:
                half = len(words) // 2
                rows.append({"query": " ".join(words[:half]), "positives": [" ".join(words[half:])]})
    return rows


def write_smoke_tasks(output_dir: Path, sizes: SmokeSizes = SmokeSizes(), seed: int = 0,
                      max_length: int = 128) -> list[TaskSpec]:
    """Write the four smoke tasks as JSONL folders under `output_dir`; return their specs."""
    plays = _load_plays()
    builders = {
        "smoke_which_play": ("classification", which_play_rows(plays)),
        "smoke_speaker_names": ("token_classification", speaker_name_rows(plays)),
        "smoke_named_character": ("qa", named_character_rows(plays, seed)),
        "smoke_speech_halves": ("retrieval", speech_halves_rows(plays)),
    }
    specs = []
    for name, (family, rows) in builders.items():
        folder = Path(output_dir) / name
        folder.mkdir(parents=True, exist_ok=True)
        for split, split_rows in _split(rows, sizes, seed).items():
            write_atomic(folder / f"{split}.jsonl",
                         "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in split_rows))
        specs.append(TaskSpec(name=name, family=family, path=str(folder), max_length=max_length))
    return specs
