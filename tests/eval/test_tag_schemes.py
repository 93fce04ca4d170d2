"""IOB1 and IOB2 tags (mlmclm/eval/finetune/tags.py): hgissbkh/conll2003-en, EncodEval's CoNLL, carries the original
IOB1 tags (its first training row [4, 0, 8, ...] = I-ORG O I-MISC, printed in
Muhammad-Hassan-Farid/Fine-Tuning-BERT-for-NER's README); the fixture holds them so, the paper task declares them, and
entity F1 reads them as IOB1."""
import random

import pytest
from eval_fixtures import make_task_folder, write_jsonl
from hub_fixtures import CONLL_TAGS
from seqeval.metrics import f1_score
from seqeval.scheme import IOB2

from mlmclm.eval.finetune.metrics import entity_f1
from mlmclm.eval.finetune.presets import paper_task
from mlmclm.eval.finetune.tags import entity_starts
from mlmclm.eval.finetune.task_loading import load_task
from mlmclm.eval.finetune.task_spec import TaskDataError, TaskSpec


def iob1_to_iob2(tags):
    """The oracle: every entity opened by position (after O, at the start, after another type) begins with B-."""
    out = []
    for i, tag in enumerate(tags):
        previous = tags[i - 1] if i else "O"
        opens = tag != "O" and (previous == "O" or previous[2:] != tag[2:])
        out.append("B-" + tag[2:] if opens else tag)
    return out


def test_paper_conll_is_read_as_the_iob1_it_is(paper_root):
    spec = paper_task("conll2003", paper_root)
    assert spec.tag_scheme == "IOB1" and paper_task("uner_en").tag_scheme == "IOB2"
    data = load_task(spec)
    assert data.labels == CONLL_TAGS  # the dataset's ids, as before
    starts = [tag for split in ("train", "validation", "test") for row in data[split]
              for tag in entity_starts(row["tags"])]
    assert starts and all(tag.startswith("I-") for tag in starts)  # IOB1: entities open with I-, not B-
    assert any("B-" in tag for row in data["train"] for tag in row["tags"])  # B- where an entity follows its type


def test_entity_f1_reads_iob1_as_iob1():
    # seqeval's default (conlleval) mode opens an entity at an I- after O or another type: on IOB1 tags it counts
    # the entities strict IOB2 counts after conversion — the secondary TC score is right on CoNLL's IOB1
    rng = random.Random(0)
    types = ["PER", "LOC", "ORG"]
    for _ in range(200):
        def sentence():
            tags = []
            for _ in range(rng.randint(1, 10)):
                roll = rng.random()
                if roll < 0.4:
                    tags.append("O")
                else:
                    kind = rng.choice(types)
                    follows = tags and tags[-1] != "O" and tags[-1][2:] == kind
                    tags.append(("B-" if follows and rng.random() < 0.5 else "I-") + kind)
            return tags
        gold = [sentence() for _ in range(5)]
        pred = [[t if rng.random() < 0.7 else rng.choice(["O", "I-PER", "B-PER", "I-LOC"]) for t in g] for g in gold]
        strict = f1_score([iob1_to_iob2(g) for g in gold], [iob1_to_iob2(p) for p in pred], mode="strict",
                          scheme=IOB2, zero_division=0)
        assert entity_f1(gold, pred) == pytest.approx(strict)
    assert entity_f1([["I-ORG", "O", "I-MISC"]], [["B-ORG", "O", "B-MISC"]]) == 1.0  # the same two entities
    assert entity_f1([["I-PER", "B-PER"]], [["I-PER", "I-PER"]]) == 0.0  # two names vs one


def test_a_custom_task_declares_its_scheme_and_the_tags_must_follow_it(tmp_path):
    iob1 = make_task_folder(tmp_path / "iob1", "token_classification")
    rows = [{"tokens": ["new", "york", "and", "alice", "bob"], "tags": ["I-LOC", "I-LOC", "O", "I-PER", "B-PER"]}]
    write_jsonl(iob1 / "train.jsonl", rows * 8)
    write_jsonl(iob1 / "validation.jsonl", rows)
    write_jsonl(iob1 / "test.jsonl", rows)
    with pytest.raises(TaskDataError, match=r"tag 'I-LOC' but train has no 'B-LOC'.*\"tag_scheme\": \"IOB1\""):
        load_task(TaskSpec(name="ner", family="token_classification", path=str(iob1)))
    data = load_task(TaskSpec(name="ner", family="token_classification", path=str(iob1), tag_scheme="IOB1"))
    assert data.labels == ["O", "B-PER", "I-LOC", "I-PER"]
    iob2 = make_task_folder(tmp_path / "iob2", "token_classification")  # B- opens every entity
    with pytest.raises(TaskDataError, match=r"task 'ner' declares IOB1, but all \d+ entities .* open with B-"):
        load_task(TaskSpec(name="ner", family="token_classification", path=str(iob2), tag_scheme="IOB1"))
    with pytest.raises(ValueError, match="tag_scheme must be one of"):
        TaskSpec(name="ner", family="token_classification", path=str(iob2), tag_scheme="BILOU")
