#!/usr/bin/env python
"""The evaluation grid's throughput with 1 worker against N workers on one node: the same `tools/evaluate.py grid`
command (the smoke suite on a random EuroBERT of the demo's size) run whole, side by side, rounds interleaved and
the side that goes first alternating, each into the same fresh output folder. A side's time is the command's wall
time, start-up, planning and summary included: what a user waits for.

    python benchmarks/eval_throughput.py                        # 1 vs 2 workers, one torch thread each, 3 rounds
    python benchmarks/eval_throughput.py --workers 2 --threads 1 --rounds 3 --seeds 0 1 2 3 --max-steps 40
    python benchmarks/eval_throughput.py --all-threads          # + 1 worker on every core (torch's default)

Goal (issue 53): N=2 workers on 2 cores, one thread each, take at most 0.6x the 1-worker time. Also checked: the
records of every side are the same, bit for bit (same threads per worker: on CPU the last bits depend on them).
Other load on the machine only ever slows a round down, so the fastest round of each side is the figure, with the
median and the load average printed beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_model(folder: Path, hidden: int, layers: int) -> Path:
    """A random EuroBERT (`hidden` wide, `layers` deep) with a word-level tokenizer over the smoke tasks' words."""
    import re

    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import EuroBertConfig, EuroBertForMaskedLM, PreTrainedTokenizerFast

    from mlmclm.eval.checks.smoke_tasks import write_smoke_tasks

    specs = write_smoke_tasks(folder / "words")
    words = set()
    for spec in specs:
        for path in Path(spec.path).glob("*.jsonl"):
            words |= set(re.findall(r"\w+|[^\w\s]", path.read_text(encoding="utf-8")))
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|mask|>", "<|pad|>", "<unk>"]
    vocab = {token: i for i, token in enumerate(specials + sorted(words))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A <|end_of_text|>",
        pair="<|begin_of_text|> $A <|end_of_text|> $B:1 <|end_of_text|>:1",
        special_tokens=[("<|begin_of_text|>", 0), ("<|end_of_text|>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|begin_of_text|>",
                                   eos_token="<|end_of_text|>", mask_token="<|mask|>", pad_token="<|pad|>",
                                   unk_token="<unk>")
    torch.manual_seed(0)
    config = EuroBertConfig(vocab_size=len(vocab), hidden_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=max(1, hidden // 32), num_key_value_heads=max(1, hidden // 64),
                            intermediate_size=2 * hidden, max_position_embeddings=512, pad_token_id=3,
                            bos_token_id=0, eos_token_id=1, mask_token_id=2)
    model_dir = folder / "model"
    EuroBertForMaskedLM(config).save_pretrained(model_dir)
    fast.save_pretrained(model_dir)
    shutil.rmtree(folder / "words")
    return model_dir


def run_side(model: Path, out: Path, workers: int, threads: int | None, args) -> tuple[float, str]:
    """The command's wall time, and the line it prints of what it spent (its records' CPU-worker-hours, its units
    per hour: the grid's own measure of the same run)."""
    if out.exists():
        shutil.rmtree(out)
    command = [sys.executable, str(ROOT / "tools" / "evaluate.py"), "grid", "--model", f"bench={model}", "--smoke",
               "--seeds", *map(str, args.seeds), "--max-steps", str(args.max_steps), "--batch-size",
               str(args.batch_size), "--device", "cpu", "--workers", str(workers), "--output", str(out)]
    if threads is not None:
        command += ["--threads", str(threads)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "MLMCLM_PROGRESS_SECONDS": "3600"}
    started = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    spent = [line for line in result.stdout.splitlines() if line.startswith("spent: ")]
    return seconds, spent[-1] if spent else "(no spent line)"


def records(out: Path) -> dict[str, str]:
    """Every record, less its time and worker (what differs between two runs of one grid)."""
    found = {}
    for path in sorted((out / "runs").glob("*/*/*.json")):
        record = json.loads(path.read_text())
        record.pop("seconds")
        record["extra"].pop("worker", None)
        found[str(path.relative_to(out))] = json.dumps(record, sort_keys=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker, both sides (default 1)")
    parser.add_argument("--all-threads", action="store_true",
                        help="also time 1 worker with torch's default threads (every core)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    sides = {"1 worker": (1, args.threads), f"{args.workers} workers": (args.workers, args.threads)}
    if args.all_threads:
        sides["1 worker, default threads"] = (1, None)
    seconds: dict[str, list[float]] = {side: [] for side in sides}
    outputs: dict[str, dict[str, str]] = {}
    spent: dict[str, str] = {}
    loads = []
    with tempfile.TemporaryDirectory(prefix="eval_throughput_") as folder:
        model = build_model(Path(folder), args.hidden, args.layers)
        out = Path(folder) / "out"  # one path for every side: a record's fingerprint holds the smoke tasks' paths
        for round_ in range(args.rounds):
            order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
            for side in order:
                loads.append(os.getloadavg()[0])
                took, line = run_side(model, out, *sides[side], args)
                seconds[side].append(took)
                if took == min(seconds[side]):
                    spent[side] = line  # the best round's, as the table's figure
                outputs.setdefault(side, records(out))
                print(f"round {round_ + 1} {side:<28} {took:7.1f} s   {line}", flush=True)
    units = len(next(iter(outputs.values())))
    print(f"\nsmoke suite, {len(args.seeds)} seeds, {args.max_steps} steps of {args.batch_size} rows, random EuroBERT "
          f"hidden {args.hidden} x {args.layers} layers, {os.cpu_count()} cores; {units} records a run; load average "
          f"(1 min) at the rounds' starts: {min(loads):.1f}-{max(loads):.1f}")
    print("| side | best s | median s | best / 1 worker |\n|---|---|---|---|")
    base = min(seconds["1 worker"])
    for side, times in seconds.items():
        print(f"| {side} | {min(times):.1f} | {statistics.median(times):.1f} | {min(times) / base:.2f}x |")
    print("\nwhat each side's best round said it spent:")
    for side, line in spent.items():
        print(f"  {side}: {line}")
    ratio = min(seconds[f"{args.workers} workers"]) / base
    print(f"{args.workers} workers / 1 worker (best rounds, {args.threads} thread(s) each): {ratio:.2f}x "
          f"(goal <= 0.6x: {'met' if ratio <= 0.6 else 'NOT met'})")
    same = outputs["1 worker"] == outputs[f"{args.workers} workers"]
    print(f"records of 1 and {args.workers} workers identical (bit for bit, less time and worker): {same}")


if __name__ == "__main__":
    main()
