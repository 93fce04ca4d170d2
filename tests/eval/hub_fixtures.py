"""A few rows of each paper source, written as its hub repository holds them (file layout, `datasets` features in
the parquet schema, split names, ClassLabel names; layouts as sources.py records where each was read), into a
mirror folder `<root>/<repo>/<path>`; `fetched_suite` then runs the real fetch from that mirror."""
import hashlib
import random
from pathlib import Path

import datasets
from datasets import ClassLabel, Dataset, Features, List, Value

from mlmclm.eval.data.fetch import fetch_suite, mirror

CONLL_TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
UNER_TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC"]
ONTONOTES_TAGS = ["O"] + [f"{p}-{t}" for t in ("PERSON", "NORP", "FAC", "ORG", "GPE", "LOC", "PRODUCT", "DATE",
                                                "TIME", "PERCENT", "MONEY", "QUANTITY", "ORDINAL", "CARDINAL",
                                                "EVENT", "WORK_OF_ART", "LAW", "LANGUAGE") for p in ("B", "I")]
NAMES, CITIES = ["alice", "bob", "carol", "dave"], ["paris", "rome", "york", "oslo"]
FILLER = ["the", "a", "cat", "dog", "sat", "ran", "good", "bad", "film", "was"]
REVISIONS = {}  # repo -> the commit the mirror says it holds (fixture values: 40 hex digits, not real commits)


def _write(root: Path, repo: str, path: str, rows: list[dict], features: Features) -> None:
    target = root / repo / path
    target.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_list(rows, features=features).to_parquet(str(target))
    REVISIONS[repo] = _revision(repo)


def _tsv(root: Path, repo: str, name: str, judgements: list[tuple[str, str, int]]) -> None:
    target = root / repo / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in judgements))
    REVISIONS[repo] = _revision(repo)


def _revision(repo: str) -> str:
    return hashlib.sha1(repo.encode()).hexdigest()  # 40 hex digits, stable; not a real commit of the repo


def _shard(split: str) -> str:
    return f"{split}-00000-of-00001.parquet"


def _glue(root, rng, sizes):
    label = lambda names: ClassLabel(names=names)  # noqa: E731
    sst2 = Features({"sentence": Value("string"), "label": label(["negative", "positive"]), "idx": Value("int32")})
    for split, n in sizes.items():
        rows = [{"sentence": " ".join(rng.choice(FILLER[:6]) for _ in range(3)) + (" good" if i % 2 else " bad"),
                 "label": i % 2 if split != "test" else -1, "idx": i} for i in range(n)]
        _write(root, "nyu-mll/glue", f"sst2/{_shard(split)}", rows, sst2)
    for config, (a, b), names, splits in (
            ("mnli", ("premise", "hypothesis"), ["entailment", "neutral", "contradiction"],
             ("train", "validation_matched", "validation_mismatched")),
            ("qqp", ("question1", "question2"), ["not_duplicate", "duplicate"], ("train", "validation"))):
        features = Features({a: Value("string"), b: Value("string"), "label": label(names), "idx": Value("int32")})
        for split in splits:
            n = sizes["train"] if split == "train" else sizes["validation"]
            rows = [{a: " ".join(rng.choice(FILLER) for _ in range(3)), b: " ".join(rng.choice(FILLER) for _ in
                                                                                 range(3)),
                     "label": i % len(names), "idx": i} for i in range(n)]
            _write(root, "nyu-mll/glue", f"{config}/{_shard(split)}", rows, features)


def tagged_sentence(rng, kinds, scheme="IOB2"):
    """Names (one-word entities of kinds[0]) and "new york" (kinds[1], kinds[2]) among filler words, in IOB2 as
    given, or in IOB1 — the original CoNLL tags, as hgissbkh/conll2003-en holds them: an entity begins with I-, and
    with B- only right after another entity of its type (two names in a row)."""
    tokens, tags = [], []
    for _ in range(rng.randint(3, 5)):
        roll = rng.random()
        if roll < 0.3:
            tokens.append(rng.choice(NAMES))
            tags.append(kinds[0])
        elif roll < 0.45:
            tokens += ["new", "york"]
            tags += [kinds[1], kinds[2]]
        else:
            tokens.append(rng.choice(FILLER))
            tags.append("O")
    if scheme == "IOB1":
        tags = [tag if tag == "O" or tag.startswith("I-") or (i and tags[i - 1][2:] == tag[2:]) else "I-" + tag[2:]
                for i, tag in enumerate(tags)]
    return tokens, tags


def _token_sets(root, rng, sizes):
    sets = (("hgissbkh/conll2003-en", "data/{split}-00000-of-00001.parquet", "words", "ner", CONLL_TAGS,
             ("B-PER", "B-LOC", "I-LOC"), "IOB1"),
            ("hgissbkh/ontonotes5", "default/{split}/0000.parquet", "tokens", "tags", ONTONOTES_TAGS,
             ("B-PERSON", "B-GPE", "I-GPE"), "IOB2"),
            ("hgissbkh/uner_en", "data/{split}-00000-of-00001.parquet", "tokens", "ner_tags", UNER_TAGS,
             ("B-PER", "B-LOC", "I-LOC"), "IOB2"))
    for repo, layout, words, tags_column, names, kinds, scheme in sets:
        columns = {words: List(Value("string")), tags_column: List(ClassLabel(names=names))}
        if repo.endswith("uner_en"):
            columns = {"idx": Value("int32"), "text": Value("string"), **columns, "annotator": Value("string")}
        for split, n in sizes.items():
            rows = []
            for i in range(n):
                tokens, tags = tagged_sentence(rng, kinds, scheme)
                row = {words: tokens, tags_column: [names.index(t) for t in tags]}
                if repo.endswith("uner_en"):
                    row = {"idx": i, "text": " ".join(tokens), **row, "annotator": "a"}
                rows.append(row)
            _write(root, repo, layout.format(split=split), rows, Features(columns))


def _qa_sets(root, rng, sizes):
    features = Features({"id": Value("string"), "title": Value("string"), "context": Value("string"),
                         "question": Value("string"),
                         "answers": {"text": List(Value("string")), "answer_start": List(Value("int32"))}})
    for repo, layout in (("rajpurkar/squad", "plain_text/{split}-00000-of-00001.parquet"),
                         ("rajpurkar/squad_v2", "squad_v2/{split}-00000-of-00001.parquet"),
                         ("hgissbkh/qed", "data/{split}-00000-of-00001.parquet"),
                         ("hgissbkh/record", "data/{split}-00000-of-00001.parquet")):
        for split in ("train", "validation"):
            rows = []
            for i in range(sizes[split]):
                person, city = rng.choice(NAMES), rng.choice(CITIES)
                context = f"{person} lives in {city} ."
                rows.append({"id": f"{split}{i}", "title": "t", "context": context,
                             "question": f"where does {person} live ?",
                             "answers": {"text": [city], "answer_start": [context.index(city)]}})
            _write(root, repo, layout.format(split=split), rows, features)


# Retrieval: what the protocol must do with it is in the names — `zero` documents are judged with score 0 (in the
# corpus, never relevant), `twin` documents share one text under two ids, `unjudged` ones must be cut away.
MSMARCO_DOCS = {"m1": "alice is red", "m2": "bob is blue", "m3": "carol is green", "m4": "dave is red",
                "m-zero": "the cat sat", "m-twin-a": "good film", "m-twin-b": "good film",
                "m-unjudged": "a dog ran"}
MSMARCO_QUERIES = {"q1": "color of alice", "q2": "color of bob", "q3": "color of carol", "q4": "color of dave",
                   "q5": "good film", "q-train": "the film"}
MSMARCO_DEV = [("q1", "m1", 1), ("q1", "m-zero", 0), ("q2", "m2", 1), ("q5", "m-twin-a", 1)]
MSMARCO_TEST = [("q3", "m3", 2), ("q4", "m4", 1), ("q4", "m-twin-b", 0)]
NQ_DOCS = {"doc0": ("alice", "lives in paris"), "doc1": ("bob", "lives in rome"), "doc2": ("carol", "lives in york"),
           "doc3": ("dave", "lives in oslo"), "doc-zero": ("", "the cat sat"), "doc-unjudged": ("x", "a dog")}
NQ_TEST = [(f"test{i}", f"doc{i}", 1) for i in range(4)] + [("test0", "doc-zero", 0)]
MLDR_DOCS = {"d1": "alice lives in paris", "d2": "bob lives in rome", "d3": "carol lives in york",
             "d-negative": "the cat sat", "d-unused": "a dog ran"}


def _retrieval(root, rng, train_rows):
    pairs = Features({"query": Value("string"), "positive": Value("string")})
    rows = [{"query": f"color of {n}", "positive": f"{n} is {rng.choice(['red', 'blue'])}"}
            for n in NAMES for _ in range(train_rows // 4)]
    _write(root, "hgissbkh/msmarco-pairs", "data/train-00000-of-00001.parquet", rows, pairs)
    corpus = Features({"_id": Value("string"), "title": Value("string"), "text": Value("string")})
    queries = Features({"_id": Value("string"), "title": Value("string"), "text": Value("string")})
    _write(root, "BeIR/msmarco", "corpus/corpus-00000-of-00001.parquet",
           [{"_id": k, "title": "", "text": v} for k, v in MSMARCO_DOCS.items()], corpus)
    _write(root, "BeIR/msmarco", "queries/queries-00000-of-00001.parquet",
           [{"_id": k, "title": "", "text": v} for k, v in MSMARCO_QUERIES.items()], queries)
    _tsv(root, "BeIR/msmarco-qrels", "train.tsv", [("q-train", "m-unjudged", 1)])
    _tsv(root, "BeIR/msmarco-qrels", "dev.tsv", MSMARCO_DEV)
    _tsv(root, "BeIR/msmarco-qrels", "test.tsv", MSMARCO_TEST)
    _write(root, "BeIR/nq", "corpus/corpus-00000-of-00001.parquet",
           [{"_id": k, "title": t, "text": v} for k, (t, v) in NQ_DOCS.items()], corpus)
    _write(root, "BeIR/nq", "queries/queries-00000-of-00001.parquet",
           [{"_id": f"test{i}", "title": "", "text": f"where does {n} live"} for i, n in enumerate(NAMES)], queries)
    _tsv(root, "BeIR/nq-qrels", "test.tsv", NQ_TEST)
    passage = {"docid": Value("string"), "text": Value("string")}
    mldr = Features({"query_id": Value("string"), "query": Value("string"),
                     "positive_passages": List(passage), "negative_passages": List(passage)})
    judged = {"dev": [("mq1", "alice", "d1"), ("mq2", "bob", "d2")], "test": [("mq3", "carol", "d3")]}
    for split, entries in judged.items():
        _write(root, "hgissbkh/mldr-en", f"default/{split}/0000.parquet",
               [{"query_id": q, "query": f"where does {n} live", "positive_passages": [
                   {"docid": d, "text": MLDR_DOCS[d]}], "negative_passages": [
                   {"docid": "d-negative", "text": MLDR_DOCS["d-negative"]}]} for q, n, d in entries], mldr)
    _write(root, "hgissbkh/mldr-en", "corpus/corpus/0000.parquet",
           [{"docid": k, "text": v} for k, v in MLDR_DOCS.items()], Features(passage))


def build_mirror(root: Path, train_rows: int = 16, eval_rows: int = 4, seed: int = 0) -> Path:
    datasets.disable_progress_bars()
    rng = random.Random(seed)
    sizes = {"train": train_rows, "validation": eval_rows, "test": eval_rows}
    _glue(root, rng, sizes)
    _token_sets(root, rng, sizes)
    _qa_sets(root, rng, sizes)
    _retrieval(root, rng, train_rows)
    return root


def fetched_suite(tmp: Path, tasks=None) -> Path:
    """A data root written by the real fetch, from a mirror of every paper repository."""
    from mlmclm.eval.finetune.presets import PAPER_TASKS

    hub = mirror(build_mirror(tmp / "mirror"), dict(REVISIONS))
    fetch_suite(tmp / "data", tasks or list(PAPER_TASKS), hub=hub, progress=False)
    return tmp / "data"
