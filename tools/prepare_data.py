#!/usr/bin/env python
"""Raw text or a Hugging Face dataset -> packed webdataset shards + manifest.json. Library: mlmclm.data.prepare.

    python tools/prepare_data.py --input corpus/*.jsonl.gz --output data/run1 \\
        --tokenizer EuroBERT/EuroBERT-210m --seq-length 2048
    python tools/prepare_data.py --dataset HuggingFaceFW/fineweb-edu --dataset-config sample-10BT --streaming ...
    python tools/prepare_data.py --embedded --output data/demo --seq-length 256    # demo corpus + tokenizer

Partitioned (N independent jobs, e.g. a Slurm array; then one merge):

    python tools/prepare_data.py --input ... --output data/fw --partition I --num-partitions N   # I = 0..N-1
    python tools/prepare_data.py merge data/fw          # checks the parts, writes data/fw/manifest.json

`--partition slurm` takes I from $SLURM_ARRAY_TASK_ID.
"""
from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys

from mlmclm.data.partition import MergeError, merge
from mlmclm.data.prepare import PrepareConfig, prepare, prepare_embedded_corpus
from mlmclm.data.shards import ShardError
from mlmclm.data.sources import PrepareError
from mlmclm.redact import install_log_redaction, redact


def _partition(value: str) -> int:
    if value == "slurm":
        value = os.environ.get("SLURM_ARRAY_TASK_ID", "")
        if not value:
            raise argparse.ArgumentTypeError("--partition slurm: $SLURM_ARRAY_TASK_ID is not set")
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--partition: {value!r} is not an integer (or 'slurm')") from None


def main_merge(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="prepare_data.py merge",
                                description="Merge the parts of a partitioned preparation into one dataset.")
    p.add_argument("output", help="the --output of the parts; gets manifest.json (+ tails-*.tar)")
    p.add_argument("parts", nargs="*", help="part directories (default: OUTPUT/part-*-of-*)")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="skip reading every shard to check its checksum (counts and tails are still checked)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    install_log_redaction()
    try:
        m = merge(args.output, args.parts or None, verify=args.verify,
                  command="python tools/prepare_data.py merge " + shlex.join(argv))
    except (MergeError, PrepareError, ShardError) as err:
        print(redact(f"error: {err}"), file=sys.stderr)
        return 2
    print(f"{m.num_samples} samples, {m.num_tokens} tokens, {len(m.shards)} shards from {len(m.parts)} parts: "
          f"{m.location}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["merge"]:
        return main_merge(argv[1:])
    defaults = PrepareConfig(inputs=["-"], output_dir="-", tokenizer="-", seq_length=2)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", default=[], help=".txt/.jsonl/.parquet files (.gz too), directories, globs")
    p.add_argument("--dataset", help="Hugging Face dataset: hub name, save_to_disk directory, or a local "
                                     "directory load_dataset reads")
    p.add_argument("--dataset-config", help="the dataset's configuration (subset) name")
    p.add_argument("--split", default=defaults.split)
    p.add_argument("--streaming", action="store_true", help="stream the dataset instead of downloading it first")
    p.add_argument("--embedded", action="store_true", help="the embedded demo corpus and tokenizer")
    p.add_argument("--output", required=True, help="output directory (shards + manifest.json)")
    p.add_argument("--tokenizer", default="embedded", help="HF hub name or local directory ('embedded': demo BPE)")
    p.add_argument("--seq-length", type=int, required=True)
    p.add_argument("--text-field", default=defaults.text_field, help="jsonl field / parquet or dataset column")
    p.add_argument("--samples-per-shard", type=int, default=defaults.samples_per_shard)
    p.add_argument("--workers", type=int, default=defaults.workers, help="tokenizer processes (1: in-process)")
    p.add_argument("--max-tokens", type=int, default=None, help="stop after this many tokens")
    p.add_argument("--partition", type=_partition, default=0, help="this job's partition (or 'slurm')")
    p.add_argument("--num-partitions", type=int, default=1, help="N jobs; each writes OUTPUT/part-I-of-N")
    p.add_argument("--group-docs", type=int, default=defaults.group_docs,
                   help="documents per group (the unit partitions share out); a merge needs the same value")
    p.add_argument("--token-dtype", choices=["uint16", "int32"], help="default: uint16 when the vocabulary fits")
    p.add_argument("--validation-every", type=int, default=None, metavar="K",
                   help="hold out every K-th document as a validation split in OUTPUT/validation (1000: 0.1%%)")
    p.add_argument("--max-document-chars", type=int, default=defaults.max_document_chars,
                   help="refuse a longer document (a .txt file, a .jsonl line, a value) instead of holding it in "
                        "memory (default: %(default)s)")
    p.add_argument("--no-require-mask-token", dest="require_mask_token", action="store_false",
                   help="allow a tokenizer without a mask token (CLM-only data)")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    install_log_redaction()
    command = "python tools/prepare_data.py " + shlex.join(argv)
    common = dict(samples_per_shard=args.samples_per_shard, workers=args.workers, progress=args.progress,
                  command=command, partition=args.partition, num_partitions=args.num_partitions,
                  group_docs=args.group_docs, token_dtype=args.token_dtype, validation_every=args.validation_every)
    if sum(map(bool, (args.embedded, args.input, args.dataset))) != 1:
        p.error("give one of --input, --dataset or --embedded")
    try:
        if args.embedded:
            manifest = prepare_embedded_corpus(args.output, args.seq_length, args.max_tokens, **common)
        else:
            manifest = prepare(PrepareConfig(
                inputs=args.input, output_dir=args.output, tokenizer=args.tokenizer, seq_length=args.seq_length,
                text_field=args.text_field, max_tokens=args.max_tokens, require_mask_token=args.require_mask_token,
                dataset=args.dataset, dataset_config=args.dataset_config, split=args.split,
                streaming=args.streaming, max_document_chars=args.max_document_chars, **common,
            ))
    except (PrepareError, ShardError) as err:
        print(redact(f"error: {err}"), file=sys.stderr)
        return 2
    print(f"{manifest.num_samples} samples, {manifest.num_tokens} tokens, {len(manifest.shards)} shards: "
          f"{manifest.location}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
