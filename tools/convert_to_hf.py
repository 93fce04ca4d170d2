"""Export a training checkpoint as a Hugging Face EuroBERT model directory (no remote code needed to load it).

  python tools/convert_to_hf.py runs/clm out/clm_hf                  # latest checkpoint of a run
  python tools/convert_to_hf.py runs/clm/checkpoints/iter_0001000 out/hf --dtype bf16 --verify
  python tools/convert_to_hf.py runs/clm out/clm_st --sentence-transformers   # also a SentenceTransformer(DIR)
The model shape, phases and tokenizer come from the checkpoint; any TP/PP/VPP/DP layout is read.
"""
from __future__ import annotations

from mlmclm import quiet

quiet.install()  # before anything imports megatron/torch: no TE/apex/CUDA-absent warning walls

import argparse
import sys
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=Path, help="run directory (latest checkpoint), checkpoints/ or iter_* dir")
    p.add_argument("output", type=Path, help="HF model directory to create")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="weight dtype written (default fp32)")
    p.add_argument("--verify", action="store_true",
                   help="compare HF and megatron logits on CPU (bidirectional) before publishing the output")
    p.add_argument("--tolerance", type=float, default=None, help="max abs logit difference --verify accepts")
    p.add_argument("--verify-length", type=int, default=None,
                   help="tokens per sequence --verify compares (default 48; up to the exported max positions: a "
                        "long-context phase's export is worth checking at its long length)")
    p.add_argument("--tokenizer", help="override the run's tokenizer (local dir, hub name or 'embedded')")
    p.add_argument("--max-shard-gb", type=float, default=5.0, help="safetensors shard size (default 5 GB)")
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    st = p.add_argument_group("sentence-transformers (docs/evaluation.md)")
    st.add_argument("--sentence-transformers", action="store_true",
                    help="also write the files sentence-transformers reads: the encoder without the MLM head in "
                         "OUTPUT/0_Transformer (a second copy of its weights), mean pooling, normalisation, the "
                         "prompts below, so SentenceTransformer(OUTPUT) embeds as our retrieval evaluation does")
    st.add_argument("--query-prompt", default="Query: ", help="prompt 'query' (default: the paper's 'Query: ')")
    st.add_argument("--document-prompt", default="Document: ",
                    help="prompt 'document' (default: the paper's 'Document: ')")
    st.add_argument("--max-seq-length", type=int, default=None,
                    help="tokens an input is cut at (default: the exported max_position_embeddings)")
    st.add_argument("--pooling", choices=["mean", "lasttoken"], default="mean", help="default mean")
    return p.parse_args(argv)


def main(argv=None) -> int:
    from mlmclm.convert.cli import run_cli
    from mlmclm.convert.to_hf import ExportConfig, convert_to_hf
    from mlmclm.export.sentence_transformers import SentenceTransformerLayout

    args = parse_args(argv)

    def work() -> str:
        extra = {} if args.tolerance is None else {"tolerance": args.tolerance}
        if args.verify_length is not None:
            extra["verify_length"] = args.verify_length
        if args.sentence_transformers:
            extra["sentence_transformers"] = SentenceTransformerLayout(
                args.query_prompt, args.document_prompt, args.max_seq_length, args.pooling)
        elif (args.query_prompt, args.document_prompt, args.max_seq_length, args.pooling) != (
                "Query: ", "Document: ", None, "mean"):
            raise ValueError("--query-prompt/--document-prompt/--max-seq-length/--pooling need "
                             "--sentence-transformers")
        cfg = ExportConfig(args.checkpoint, args.output, dtype=args.dtype, force=args.force, verify=args.verify,
                           tokenizer=args.tokenizer, max_shard_bytes=int(args.max_shard_gb * 2**30), **extra)
        return convert_to_hf(cfg).text()

    return run_cli(work)


if __name__ == "__main__":
    sys.exit(main())
