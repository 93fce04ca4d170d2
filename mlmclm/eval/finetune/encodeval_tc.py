"""EncodEval's token classification rules that decide which word a token votes for and how a word's votes are
counted, read in rimads/avey-b EncodEval/encodeval/eval_tasks/TC.py at 810ad06 (`tokenize`,
`get_token_predictions_labels`; the stored hgissbkh/EncodEval@MLM_vs_CLM lacks its evaluator files).

1. **Which word a token belongs to** (`encodeval_token_words`): by its *start* offset alone, scanning the words of
   `" ".join(words)` left to right. A word's span runs from its first character up to, not including, the first
   character after it, so the separating space belongs to the *next* word: a token that is only that space (a
   byte-level BPE emits one where it has no merge for the space and the next character) is labelled with the next
   word in training and votes for it at evaluation. Tokens with offsets (0, 0) (special tokens) and tokens that
   start past the last word (the EOS EncodEval appends) belong to no word.
2. **The vote** (`encodeval_vote`): `max(set(votes), key=votes.count)`: the most frequent id, and among ids with
   the same count the first one a CPython set of those ids yields. For ints a set is a hash table indexed by the
   value modulo its size, so that order is not ascending: votes [1, 8] give 8 (8 sits in slot 0 of the 8-slot
   table). CoNLL's I-MISC is 8 and OntoNotes' tags run to 36, so ties there depend on it.

   How ours is equal: the walk of CPython's set table (Objects/setobject.c: 8 slots to start, linear probing over
   9 slots then the perturbed jump, growth x4 once 3/5 full, the table re-filled in slot order) is written out in
   `set_order` below, so the vote is EncodEval's under CPython whatever interpreter runs this code.
   tests/eval/test_encodeval_tc.py checks `set_order` against the running interpreter's own `set` on random id
   lists; the same check passed under CPython 3.11 and 3.12 (docs/evaluation.md).
"""
from __future__ import annotations

from collections.abc import Sequence

_MIN_SLOTS = 8  # PySet_MINSIZE
_LINEAR_PROBES = 9  # LINEAR_PROBES: slots tried after the home slot before jumping
_PERTURB_SHIFT = 5


def encodeval_token_words(offsets: Sequence[tuple[int, int]], words: Sequence[str]) -> list[int | None]:
    """Per token, the index of the word EncodEval labels it with (None: none), from the tokens' character offsets
    in `" ".join(words)` (+ the EOS). The scan only moves forward, as TC.py's does."""
    owners: list[int | None] = []
    word, word_start = 0, 0
    for start, end in offsets:
        if (start, end) == (0, 0):  # special tokens (TC.py: offset == (0, 0) -> -100)
            owners.append(None)
            continue
        while word < len(words) and start >= word_start + len(words[word]):
            word_start += len(words[word]) + 1  # the word and the space after it
            word += 1
        owners.append(word if word < len(words) else None)
    return owners


def _probe(table: list[int | None], value: int) -> int:
    """The slot CPython puts a new non-negative int `value` (its own hash) in: the home slot value & mask, then,
    where the table has room after it, the next LINEAR_PROBES slots, then a jump to (i * 5 + 1 + perturb) & mask with
    perturb the value shifted right by 5 more each time (set_add_entry, set_insert_clean)."""
    mask = len(table) - 1
    slot, perturb = value & mask, value
    while True:
        probes = _LINEAR_PROBES if slot + _LINEAR_PROBES <= mask else 0
        for candidate in range(slot, slot + probes + 1):
            if table[candidate] is None:
                return candidate
        perturb >>= _PERTURB_SHIFT
        slot = (slot * 5 + 1 + perturb) & mask


def set_order(values: Sequence[int]) -> list[int]:
    """The order in which `set(values)` iterates distinct non-negative ints under CPython: add each value in turn
    to a table of 8 slots; once the filled slots reach 3/5 of the mask (fill * 5 >= mask * 3) the table grows to
    the smallest power of two above 4 x the entries, re-filled in the old table's slot order; iterate by slot."""
    table: list[int | None] = [None] * _MIN_SLOTS
    used = 0
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"set_order: tag ids are non-negative ints, got {value!r}")
        if value in table:
            continue
        table[_probe(table, value)] = value
        used += 1
        if used * 5 >= (len(table) - 1) * 3:
            size = _MIN_SLOTS
            while size <= used * 4:  # set_table_resize(so, used * 4) for sets under 50,000 entries
                size <<= 1
            old, table = table, [None] * size
            for kept in old:
                if kept is not None:
                    table[_probe(table, kept)] = kept
    return [value for value in table if value is not None]


def encodeval_vote(votes: Sequence[int]) -> int:
    """A word's predicted id: the most frequent of its tokens' predicted ids, ties going to the one met first in
    CPython's set order (`max` keeps the first maximum)."""
    if not votes:
        raise ValueError("encodeval_vote: a word without votes")
    return max(set_order(votes), key=list(votes).count)
