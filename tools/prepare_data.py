#!/usr/bin/env python
"""Raw text -> packed webdataset shards + manifest.json. Library: mlmclm.data.prepare.

    python tools/prepare_data.py --input corpus/*.jsonl.gz --output data/run1 \
        --tokenizer EuroBERT/EuroBERT-210m --seq-length 2048
    python tools/prepare_data.py --embedded --output data/demo --seq-length 256    # demo corpus + tokenizer
"""
from __future__ import annotations

import argparse
import logging
import shlex
import sys

from mlmclm.data.prepare import PrepareConfig, prepare, prepare_embedded_corpus
from mlmclm.data.shards import ShardError
from mlmclm.data.sources import PrepareError


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    defaults = PrepareConfig(inputs=["-"], output_dir="-", tokenizer="-", seq_length=2)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", default=[], help=".txt/.jsonl/.parquet files (.gz too), directories, globs")
    p.add_argument("--embedded", action="store_true", help="the embedded demo corpus and tokenizer")
    p.add_argument("--output", required=True, help="output directory (shards + manifest.json)")
    p.add_argument("--tokenizer", default="embedded", help="HF hub name or local directory ('embedded': demo BPE)")
    p.add_argument("--seq-length", type=int, required=True)
    p.add_argument("--text-field", default=defaults.text_field, help="jsonl field / parquet column with the text")
    p.add_argument("--samples-per-shard", type=int, default=defaults.samples_per_shard)
    p.add_argument("--workers", type=int, default=defaults.workers, help="tokenizer processes (1: in-process)")
    p.add_argument("--max-tokens", type=int, default=None, help="stop after this many tokens")
    p.add_argument("--no-require-mask-token", dest="require_mask_token", action="store_false",
                   help="allow a tokenizer without a mask token (CLM-only data)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    command = "python tools/prepare_data.py " + shlex.join(argv)
    try:
        if args.embedded:
            if args.input:
                p.error("--embedded and --input exclude each other")
            manifest = prepare_embedded_corpus(args.output, args.seq_length, args.max_tokens, workers=args.workers,
                                               samples_per_shard=args.samples_per_shard, progress=args.progress,
                                               command=command)
        else:
            if not args.input:
                p.error("give --input (or --embedded)")
            manifest = prepare(PrepareConfig(
                inputs=args.input, output_dir=args.output, tokenizer=args.tokenizer, seq_length=args.seq_length,
                text_field=args.text_field, samples_per_shard=args.samples_per_shard, workers=args.workers,
                max_tokens=args.max_tokens, require_mask_token=args.require_mask_token, progress=args.progress,
                command=command,
            ))
    except (PrepareError, ShardError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{manifest.num_samples} samples, {manifest.num_tokens} tokens, {len(manifest.shards)} shards: "
          f"{manifest.location}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
