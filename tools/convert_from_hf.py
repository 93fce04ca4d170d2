"""Convert a Hugging Face EuroBERT or Llama-family model into a megatron checkpoint for continued pretraining.

  python tools/convert_from_hf.py path/to/EuroBERT-210m out/eurobert210m --tp 2
  python tools/convert_from_hf.py path/to/SmolLM2-135M out/smollm --tp 1 --pp 2
Then train from it with `checkpoint.init_from: out/smollm`. Tied embeddings are untied into an LM head; RoPE
theta and Llama-3 scaling are carried; biases and other RoPE scalings are refused. Never runs remote code.
"""
from __future__ import annotations

from mlmclm import quiet

quiet.install()  # before anything imports megatron/torch: no TE/apex/CUDA-absent warning walls

import argparse
import sys
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="local HF model directory (or a hub name, when online)")
    p.add_argument("output", type=Path, help="directory to create (a run-shaped dir holding iter_0000000)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size of the saved checkpoint")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size of the saved checkpoint")
    p.add_argument("--vpp", type=int, default=None, help="virtual pipeline stages per pipeline rank")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="parameter dtype saved")
    p.add_argument("--make-vocab-divisible-by", type=int, default=128, help="vocabulary padding multiple (× TP)")
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    return p.parse_args(argv)


def main(argv=None) -> int:
    from mlmclm.convert.cli import run_cli
    from mlmclm.convert.from_hf import ImportConfig, convert_from_hf

    args = parse_args(argv)

    def work() -> str:
        cfg = ImportConfig(args.source, args.output, tensor_parallel=args.tp, pipeline_parallel=args.pp,
                           virtual_pipeline_parallel=args.vpp, dtype=args.dtype,
                           make_vocab_divisible_by=args.make_vocab_divisible_by, force=args.force)
        return convert_from_hf(cfg).text()

    return run_cli(work)


if __name__ == "__main__":
    sys.exit(main())
