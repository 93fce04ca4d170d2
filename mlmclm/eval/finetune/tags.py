"""Token-classification tags: their form, their scheme and a task's tag inventory.

Two schemes are read: IOB2 (every entity begins with B-) and IOB1 (an entity begins with I-; B- only where it
directly follows another entity of the same type) — the original CoNLL-2003 tags, which EncodEval's
`hgissbkh/conll2003-en` carries: its first training sentence, "EU rejects German call to boycott British lamb .",
is tagged [4, 0, 8, 0, 0, 0, 8, 0, 0] with ClassLabel names [O, B-PER, I-PER, B-ORG, I-ORG, B-LOC, I-LOC, B-MISC,
I-MISC], EU = I-ORG (printed in github.com/Muhammad-Hassan-Farid/Fine-Tuning-BERT-for-NER, README.md; the hub is not
reachable from here). Both schemes score alike: EncodEval's score treats tags as labels, and seqeval's default
(conlleval) mode starts an entity at an I- after O or after another type, which reads IOB1 as IOB1 (metrics.entity_f1).
"""
from __future__ import annotations

import re
from typing import Any

BIO_TAG = re.compile(r"O|[BI]-\S.*")  # outside, or Begin/Inside of an entity type
TAG_SCHEMES = ("IOB2", "IOB1")


class TagError(ValueError):
    """Tags that do not follow their form or their task's declared scheme; the message names the row."""


def check_tags(tags: list, where: str) -> None:
    """Every tag a string of the form O / B-<type> / I-<type>."""
    if not all(isinstance(t, str) for t in tags):
        raise TagError(f"{where}: field 'tags' must hold strings such as 'B-PER' / 'O'")
    for position, tag in enumerate(tags, start=1):
        if not BIO_TAG.fullmatch(tag):
            raise TagError(f"{where}: tag {tag!r} (token {position}) is not a BIO tag (IOB1 or IOB2): expected "
                           f"'O', 'B-<type>' or 'I-<type>'")


def entity_starts(tags: list[str]) -> list[str]:
    """The tags that open an entity by position: after O, at the sentence's start, or after another type."""
    starts, previous = [], "O"
    for tag in tags:
        if tag != "O" and (previous == "O" or previous[2:] != tag[2:]):
            starts.append(tag)
        previous = tag
    return starts


def _check_scheme(task: str, train: list[dict[str, Any]], scheme: str, locations: dict[int, str]) -> None:
    """IOB2: refused, an I-X whose B-X never occurs in train (IOB1 data declared IOB2, or a typo). IOB1: refused,
    a train split whose every entity opens with B- (IOB2 data declared IOB1)."""
    if scheme == "IOB2":
        seen: dict[str, str] = {}
        for row in train:
            for tag in row["tags"]:
                seen.setdefault(tag, locations.get(id(row), "train"))
        for tag, where in seen.items():
            if tag.startswith("I-") and "B-" + tag[2:] not in seen:
                raise TagError(f"{where}: tag {tag!r} but train has no {'B-' + tag[2:]!r}: IOB2 entities begin with "
                               f"B-; for IOB1 data (entities begin with I-) declare \"tag_scheme\": \"IOB1\"")
        return
    starts = [tag for row in train for tag in entity_starts(row["tags"])]
    if starts and all(tag.startswith("B-") for tag in starts):
        raise TagError(f"task {task!r} declares IOB1, but all {len(starts)} entities of its train split open with "
                       f"B- (IOB2): declare \"tag_scheme\": \"IOB2\"")


def tag_inventory(task: str, splits: dict[str, list[dict[str, Any]]], locations: dict[int, str],
                  names: list[str] | None = None, scheme: str = "IOB2") -> list[str]:
    """The tag set of a token-classification task, its train tags checked against `scheme` (_check_scheme). With
    the dataset's own tag names (`names`, its ClassLabel): those, in the dataset's id order — the ids EncodEval's
    head predicts and its vote breaks ties by. Otherwise "O" first, then train's tags sorted. Refused, naming the
    row: a tag outside the names, and (without names) a validation/test tag train never has (the model could not
    learn it; its gold would silently count as "O")."""
    _check_scheme(task, splits["train"], scheme, locations)
    if names is not None:
        for split, rows in splits.items():
            for row in rows:
                unknown = set(row["tags"]) - set(names)
                if unknown:
                    raise TagError(f"{locations.get(id(row), split)}: tags {sorted(unknown)} are not among the "
                                   f"dataset's tag names {names}")
        return list(names)
    train_tags = {tag for row in splits["train"] for tag in row["tags"]}
    for split in ("validation", "test"):
        for row in splits[split]:
            for tag in row["tags"]:
                if tag not in train_tags:
                    raise TagError(f"{locations.get(id(row), split)}: tag {tag!r} ({split} split) never occurs in "
                                   f"task {task!r}'s train split")
    return ["O"] + sorted(train_tags - {"O"})
