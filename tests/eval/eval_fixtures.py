"""Tiny random EuroBERT + word-level tokenizer, and tiny synthetic tasks of each family."""
import json
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import EuroBertConfig, EuroBertForMaskedLM, PreTrainedTokenizerFast

SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|mask|>", "<|pad|>", "<unk>"]
NAMES = ["alice", "bob", "carol", "dave"]
CITIES = ["paris", "rome", "york", "oslo"]
FILLER = ["the", "a", "cat", "dog", "sat", "ran", "good", "bad", "film", "was", "very", "lives", "in", "where",
          "does", "live", "who", "is", "red", "blue", "green", "color", "of", "new", "and", "?", ".", ","]
WORDS = NAMES + CITIES + FILLER


def save_tiny_model(directory: Path, seed: int = 0, words=None) -> Path:
    """Random 2-layer EuroBERT (hidden 32) + word-level tokenizer over `words` (default: the fixture words)."""
    vocab = {token: i for i, token in enumerate(SPECIALS + list(dict.fromkeys(words or WORDS)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    bos, eos = vocab["<|begin_of_text|>"], vocab["<|end_of_text|>"]
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A <|end_of_text|>",
        pair="<|begin_of_text|> $A <|end_of_text|> $B:1 <|end_of_text|>:1",
        special_tokens=[("<|begin_of_text|>", bos), ("<|end_of_text|>", eos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                                   mask_token="<|mask|>", pad_token="<|pad|>", unk_token="<unk>")
    torch.manual_seed(seed)
    config = EuroBertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, intermediate_size=64, max_position_embeddings=512,
                            pad_token_id=vocab["<|pad|>"], bos_token_id=bos, eos_token_id=eos,
                            mask_token_id=vocab["<|mask|>"])
    EuroBertForMaskedLM(config).save_pretrained(directory)
    fast.save_pretrained(directory)
    return directory


def evaluate_main():
    """`main` of tools/evaluate.py, loaded in-process (a fresh interpreter costs seconds)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("evaluate_cli", Path(__file__).resolve().parents[2] / "tools" /
                                                  "evaluate.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    return cli.main


def write_jsonl(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def classification_rows(n, rng, pairs=False):
    rows = []
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        words = [rng.choice(FILLER[:6]) for _ in range(4)] + ["good" if label == "pos" else "bad"]
        rng.shuffle(words)
        row = {"text": " ".join(words), "label": label}
        if pairs:
            row["text_pair"] = " ".join(rng.choice(FILLER[:6]) for _ in range(3))
        rows.append(row)
    return rows


def token_rows(n, rng):
    rows = []
    for _ in range(n):
        tokens, tags = [], []
        for _ in range(rng.randint(3, 6)):
            roll = rng.random()
            if roll < 0.25:
                tokens.append(rng.choice(NAMES)); tags.append("B-PER")
            elif roll < 0.35:
                tokens += ["new", "york"]; tags += ["B-LOC", "I-LOC"]
            else:
                tokens.append(rng.choice(FILLER[:10])); tags.append("O")
        rows.append({"tokens": tokens, "tags": tags})
    return rows


def qa_rows(n, rng):
    rows = []
    for i in range(n):
        people = rng.sample(NAMES, 2)
        cities = rng.sample(CITIES, 2)
        context = f"{people[0]} lives in {cities[0]} . {people[1]} lives in {cities[1]} ."
        asked = rng.choice(NAMES)
        if asked in people:
            city = cities[people.index(asked)]
            start = context.index(f"{asked} lives in {city}") + len(f"{asked} lives in ")
            answers = {"text": [city], "answer_start": [start]}
        else:
            answers = {"text": [], "answer_start": []}
        rows.append({"id": f"q{i}", "question": f"where does {asked} live ?", "context": context, "answers": answers})
    return rows


def retrieval_rows(n, rng):
    rows = []
    for _ in range(n):
        name, color = rng.choice(NAMES), rng.choice(["red", "blue", "green"])
        rows.append({"query": f"color of {name}", "positives": [f"{name} is {color}"],
                     "negatives": [f"{rng.choice(NAMES)} is {rng.choice(['red', 'blue'])} cat"]})
    return rows


ROW_MAKERS = {"classification": classification_rows, "token_classification": token_rows, "qa": qa_rows,
              "retrieval": retrieval_rows}


def make_task_folder(folder: Path, family: str, seed: int = 0, sizes=(48, 16, 16)) -> Path:
    rng = random.Random(seed)
    for split, n in zip(("train", "validation", "test"), sizes):
        write_jsonl(folder / f"{split}.jsonl", ROW_MAKERS[family](n, rng))
    return folder
