#!/usr/bin/env python
"""tools/prepare_data.py vs Megatron-LM's tools/preprocess_data.py: same corpus, same tokenizer, same machine.

    python benchmarks/prepare.py --megatron-lm /path/to/Megatron-LM            # ~20 MB corpus, 2 rounds
    python benchmarks/prepare.py --megatron-lm DIR --corpus-mb 40 --rounds 3 --workers 1 2

Megatron-LM is not part of this repository: DIR is a checkout of it (its `tools/preprocess_data.py` is run with
this interpreter and DIR first on PYTHONPATH, as that script expects).

Corpus: the embedded Shakespeare corpus cut into documents of about --doc-chars characters (whole paragraphs),
repeated until --corpus-mb MB, written once as jsonl ({"text": ...} per line). Tokenizer: the embedded demo
tokenizer directory (byte-level BPE, 8192 ids), given to both tools (Megatron: --tokenizer-type
HuggingFaceTokenizer --tokenizer-model DIR).

Runs: each tool at each --workers count, --rounds times, interleaved (round 1: ours w1, Megatron w1, ours w2,
Megatron w2; round 2: the same...), each a fresh subprocess timed from start to exit (start-up, reading, tokenizing,
writing). CPU time is the children's user+system time (resource.getrusage(RUSAGE_CHILDREN) before and after each
run, so it includes the tools' worker processes, which have all exited by then). Peak memory is the largest sum of
RSS over the run's process tree, sampled every 50 ms (shared pages count once per process). Both tools run with
TOKENIZERS_PARALLELISM=false (one tokenizer thread per process, so "workers" is the number of tokenizing cores)
unless --tokenizer-threads. Figures: medians over rounds of tokens/s (wall) and tokens per CPU-second, where
"tokens" are the text tokens (our manifest's tokens less one BOS and one EOS per document). After each run the
same tool runs on the first 4 documents: its wall and CPU time (imports, tokenizer load, starting the worker
processes) are subtracted for the "without start-up" figures, which say how each tool scales on a large corpus.

Same-tokens check (rounds 1 and last, each worker count): Megatron's .bin/.idx is read directly (header, dtype
code uint16 or int32, sequence lengths, document index), without --append-eod. Megatron's HuggingFaceTokenizer
keeps the tokenizer's special tokens by default, and the demo tokenizer's post-processor wraps every text as
BOS ... EOS, so each Megatron document is already BOS + text ids + EOS; with bare documents (e.g.
--tokenizer-hf-no-include-special-tokens) the check wraps them itself. Ours is read through its manifest and
shards (read_shard_starts, which validates counts and checksums), rows concatenated in manifest order, the final
padding dropped. Compared: that stream must equal the concatenation of the BOS ... EOS documents in order (the
corpus has fewer documents than prepare_data's --group-docs, so our stream is in document order), and every
document start our shards record must be a document start there (starts at row boundaries are implicit in our
format). Any difference exits non-zero.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
TINY_DOCS = 4         # documents of the start-up runs
SAMPLE_S = 0.05        # memory sampling interval
GROUP_DOCS = 100_000   # prepare_data's default; the corpus must stay under it (see the docstring)


def write_corpus(path: Path, target_mb: float, doc_chars: int) -> int:
    """jsonl of paragraphs-grouped documents from the embedded corpus, repeated to `target_mb`; returns #docs."""
    from mlmclm.data.corpus import load_works

    docs: list[str] = []
    for work in load_works():
        current = ""
        for para in work.text.split("\n\n"):
            if not para.strip():
                continue
            current = f"{current}\n\n{para}" if current else para
            if len(current) >= doc_chars:
                docs.append(current)
                current = ""
        if current.strip():
            docs.append(current)
    lines = [json.dumps({"text": d}) + "\n" for d in docs]
    size, count = sum(len(line.encode()) for line in lines), 0
    with path.open("w", encoding="utf-8") as f:
        written = 0
        while written < target_mb * 1e6:
            f.writelines(lines)
            written += size
            count += len(lines)
    return count


def read_megatron(prefix: Path) -> list[np.ndarray]:
    """Documents of a Megatron indexed dataset (.idx + .bin), each an int64 array."""
    idx = prefix.with_suffix(".idx").read_bytes()
    if idx[:9] != b"MMIDIDX\x00\x00":
        raise SystemExit(f"{prefix}.idx: not a Megatron index")
    (version,), (code,) = struct.unpack_from("<Q", idx, 9), struct.unpack_from("<B", idx, 17)
    dtype = {4: np.int32, 8: np.uint16}.get(code)
    if version != 1 or dtype is None:
        raise SystemExit(f"{prefix}.idx: version {version}, dtype code {code}: not read by this benchmark")
    n_seq, n_doc = struct.unpack_from("<QQ", idx, 18)
    off = 34
    seq_lengths = np.frombuffer(idx, np.int32, n_seq, off)
    off += 4 * n_seq + 8 * n_seq   # skip the byte pointers: sequences are contiguous
    doc_index = np.frombuffer(idx, np.int64, n_doc, off)
    tokens = np.fromfile(prefix.with_suffix(".bin"), dtype=dtype).astype(np.int64)
    seq_starts = np.concatenate([[0], np.cumsum(seq_lengths, dtype=np.int64)])
    bounds = seq_starts[doc_index]
    if bounds[-1] != len(tokens):
        raise SystemExit(f"{prefix}: index covers {bounds[-1]} tokens, .bin holds {len(tokens)}")
    return [tokens[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def read_ours(out: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    """Our token stream (rows in manifest order, final padding dropped) and recorded document starts."""
    from mlmclm.data.manifest import Manifest
    from mlmclm.data.shards import read_shard_starts

    m = Manifest.load(out)
    pad = m.tokenizer["pad_id"]
    streams, starts, base = [], [], 0
    for info in m.shards:
        tokens, st = read_shard_starts(str(out / info.name), info, m.seq_length, pad, m.dtype)
        streams.append(tokens.reshape(-1).astype(np.int64))
        starts.append(st + base)
        base += tokens.size
    stream = np.concatenate(streams)
    stream = stream[:m.num_tokens]   # padding only at the very end (a single run, one group)
    if pad is not None and np.any(np.concatenate(streams)[m.num_tokens:] != pad):
        raise SystemExit(f"{out}: tokens after the first {m.num_tokens} are not all padding")
    return stream, np.concatenate(starts), m.tokenizer


def check_same(ours: Path, megatron_prefix: Path) -> str:
    docs = read_megatron(megatron_prefix)
    stream, starts, tok = read_ours(ours)
    bos, eos = tok["bos_id"], tok["eos_id"]
    wrapped = np.array([len(d) >= 2 and d[0] == bos and d[-1] == eos for d in docs])
    if wrapped.all():   # Megatron's HuggingFaceTokenizer keeps the tokenizer's special tokens (its default)
        how, pieces = "Megatron's documents as stored (its tokenizer already adds BOS ... EOS)", docs
    elif not wrapped.any():   # e.g. --tokenizer-hf-no-include-special-tokens: bare text ids
        how = "BOS + Megatron's document + EOS"
        pieces = [np.concatenate([[bos], d, [eos]]) for d in docs]
    else:
        raise SystemExit(f"Megatron: {int(wrapped.sum())} of {len(docs)} documents are BOS ... EOS, the rest not")
    lengths = np.array([len(d) for d in pieces], dtype=np.int64)
    doc_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    expected = np.concatenate(pieces)
    if len(stream) != len(expected) or not np.array_equal(stream, expected):
        n = min(len(stream), len(expected))
        diff = int(np.argmax(stream[:n] != expected[:n])) if np.any(stream[:n] != expected[:n]) else n
        raise SystemExit(f"DIFFERENT tokens: our stream has {len(stream)} tokens, {how} gives {len(expected)}; "
                         f"first difference at {diff}")
    if not np.isin(starts, doc_starts).all():
        raise SystemExit("DIFFERENT document boundaries: a start our shards record is not a document start")
    return (f"same tokens: {len(docs)} documents, {len(stream)} tokens; our stream (rows in order, padding "
            f"dropped) == {how}, concatenated; our recorded document starts are all document starts")


def run(cmd: list[str], env: dict, log: Path) -> dict:
    """Run to exit; wall time, children's CPU time, peak of the summed RSS of the process tree (sampled)."""
    import psutil

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    peak = 0
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            rss = 0
            try:
                for q in [root, *root.children(recursive=True)]:
                    rss += q.memory_info().rss
            except psutil.Error:   # a process ended while being read
                pass
            peak = max(peak, rss)
            time.sleep(SAMPLE_S)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{log.read_text()[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "peak_mb": peak / 2**20}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--megatron-lm", required=True, type=Path, help="a Megatron-LM checkout (not vendored here)")
    p.add_argument("--corpus-mb", type=float, default=20.0)
    p.add_argument("--doc-chars", type=int, default=4000, help="about this many characters per document")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seq-length", type=int, default=512)
    p.add_argument("--tokenizer-threads", action="store_true",
                   help="let the tokenizers library use its own threads (default: TOKENIZERS_PARALLELISM=false)")
    p.add_argument("--workdir", type=Path, help="keep corpus and outputs here (default: a temporary directory)")
    args = p.parse_args()
    script = args.megatron_lm / "tools" / "preprocess_data.py"
    if not script.is_file():
        p.error(f"--megatron-lm {args.megatron_lm}: no tools/preprocess_data.py there")
    if args.rounds < 1 or min(args.workers) < 1:
        p.error("--rounds and --workers must be >= 1")

    from mlmclm.data.tokenizer import embedded_tokenizer_dir

    tok_dir = str(embedded_tokenizer_dir())
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        corpus = work / "corpus.jsonl"
        n_docs = write_corpus(corpus, args.corpus_mb, args.doc_chars)
        if n_docs >= GROUP_DOCS:
            p.error(f"{n_docs} documents >= {GROUP_DOCS}: raise --doc-chars or lower --corpus-mb")
        mb = corpus.stat().st_size / 1e6
        env = dict(os.environ)
        if not args.tokenizer_threads:
            env["TOKENIZERS_PARALLELISM"] = "false"
        meg_env = dict(env, PYTHONPATH=os.pathsep.join([str(args.megatron_lm.resolve()),
                                                        env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = float("nan")
        print(f"corpus: {mb:.1f} MB, {n_docs} documents; tokenizer {tok_dir}; cpus {os.cpu_count()}; "
              f"load before {load:.2f}; TOKENIZERS_PARALLELISM={env.get('TOKENIZERS_PARALLELISM', 'unset')}",
              flush=True)

        tiny = work / "tiny.jsonl"   # a few documents: what a run costs apart from the corpus (start-up)
        with corpus.open() as f:
            tiny.write_text("".join(f.readline() for _ in range(TINY_DOCS)))

        def ours(w, corpus=corpus, tag=""):
            out = work / f"ours{tag}-w{w}"
            return out, [sys.executable, str(REPO / "tools" / "prepare_data.py"), "--input", str(corpus),
                         "--output", str(out), "--tokenizer", tok_dir, "--seq-length", str(args.seq_length),
                         "--workers", str(w), "--no-progress"], env

        def megatron(w, corpus=corpus, tag=""):
            out = work / f"megatron{tag}-w{w}"
            return out, [sys.executable, str(script), "--input", str(corpus), "--output-prefix", str(out),
                         "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", tok_dir,
                         "--workers", str(w), "--log-interval", "1000000"], meg_env

        tools = {"prepare_data": ours, "Megatron": megatron}
        results: dict[tuple[str, int], list[dict]] = {}
        startup: dict[tuple[str, int], list[dict]] = {}
        tokens = None   # text tokens: our manifest's tokens less its BOS and EOS per document
        for r in range(args.rounds):
            for w in args.workers:
                for name, build in tools.items():
                    out, cmd, e = build(w)
                    res = run(cmd, e, work / f"{name}-w{w}.log")
                    results.setdefault((name, w), []).append(res)
                    small = run(build(w, tiny, "-tiny")[1], e, work / f"{name}-tiny-w{w}.log")
                    startup.setdefault((name, w), []).append(small)
                    print(f"round {r + 1} {name:12s} workers {w}: {res['wall']:6.1f} s wall, {res['cpu']:6.1f} "
                          f"CPU-s, peak {res['peak_mb']:.0f} MB; {TINY_DOCS} documents: {small['wall']:.1f} s wall, "
                          f"{small['cpu']:.1f} CPU-s", flush=True)
                if r == 0 or r == args.rounds - 1:
                    print("  " + check_same(work / f"ours-w{w}", work / f"megatron-w{w}_text_document"),
                          flush=True)
                    if tokens is None:
                        from mlmclm.data.manifest import Manifest

                        m = Manifest.load(work / f"ours-w{w}")
                        tokens = m.num_tokens - 2 * m.num_documents

        print(f"\n{tokens} text tokens (BOS/EOS not counted); medians over {args.rounds} rounds; load after "
              f"{os.getloadavg()[0]:.2f}")
        print(f"{'tool':12s} {'workers':>7s} {'wall s':>7s} {'tok/s':>10s} {'CPU s':>7s} {'tok/CPU-s':>10s} "
              f"{'peak MB':>8s} {'start s':>7s} {'tok/s-st':>10s} {'tok/CPU-st':>10s}")
        print(f"(start s: wall of a {TINY_DOCS}-document run; -st: with that run's wall and CPU time subtracted)")
        med, steady = {}, {}
        for (name, w), rs in sorted(results.items(), key=lambda kv: (kv[0][1], kv[0][0] != "prepare_data")):
            wall = statistics.median(x["wall"] for x in rs)
            cpu = statistics.median(x["cpu"] for x in rs)
            peak = max(x["peak_mb"] for x in rs)
            wall0 = statistics.median(x["wall"] for x in startup[name, w])
            cpu0 = statistics.median(x["cpu"] for x in startup[name, w])
            med[name, w] = (tokens / wall, tokens / cpu)
            steady[name, w] = (tokens / (wall - wall0), tokens / (cpu - cpu0))
            print(f"{name:12s} {w:7d} {wall:7.1f} {tokens / wall:10.0f} {cpu:7.1f} {tokens / cpu:10.0f} "
                  f"{peak:8.0f} {wall0:7.1f} {steady[name, w][0]:10.0f} {steady[name, w][1]:10.0f}")
        for w in args.workers:
            (ot, oc), (mt, mc) = med["prepare_data", w], med["Megatron", w]
            print(f"workers {w}: prepare_data / Megatron = {ot / mt:.2f}x tokens/s, {oc / mc:.2f}x tokens/CPU-s")
        if 1 in args.workers and 2 in args.workers:
            for name in tools:
                print(f"{name}: workers 2 / workers 1 = {med[name, 2][0] / med[name, 1][0]:.2f}x tokens/s "
                      f"({steady[name, 2][0] / steady[name, 1][0]:.2f}x without start-up)")
            ratio = med["prepare_data", 2][1] / med["Megatron", 2][1]
            scale = med["prepare_data", 2][0] / med["prepare_data", 1][0]
            print(f"goal >= 1.0x tokens/CPU-s at workers 2: {ratio:.2f}x -> {'met' if ratio >= 1.0 else 'NOT met'}")
            print(f"goal >= 1.8x scaling 1 -> 2 workers: {scale:.2f}x -> {'met' if scale >= 1.8 else 'NOT met'} "
                  f"(end to end; {steady['prepare_data', 2][0] / steady['prepare_data', 1][0]:.2f}x without start-up)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
