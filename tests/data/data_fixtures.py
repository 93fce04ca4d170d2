"""Small documents and files the data tests build (imported by name: every test folder has its own conftest)."""
import json
import random

WORDS = ("the king queen crown sword love night day speak hence fair foul tomorrow brief candle "
         "sound fury signifying nothing player stage hour").split()


def make_docs(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 120))]
        docs.append(f"Doc {i}: " + " ".join(words) + rng.choice([".", "!", "?\nNew line."]))
    return docs


def write_jsonl(path, docs, field="text"):
    path.write_text("".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path
