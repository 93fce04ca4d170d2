#!/usr/bin/env python
"""Roofline of the output layer + cross entropy on one micro-batch: bytes moved, FLOPs and the time each kernel
takes at the GPU's peak (max of compute and memory time), for the chunked head at a chunk size against megatron's
whole head (its output layer, then its fused `vocab_parallel_cross_entropy`). No GPU needed: a model, not a
measurement — it says where the time must go, and so which chunk size the GPU default is.

    python benchmarks/head_roofline.py                       # eurobert-1b, 10,339 tokens, H100 SXM
    python benchmarks/head_roofline.py --gpu h200 --model eurobert-210m --tokens 4136

Each kernel's traffic is read off the code that runs (bf16 compute, fp32 softmax, TP 1):
- megatron's whole head: the logits GEMM writes bf16 logits; its fused cross entropy (megatron/core/fusions/
  fused_cross_entropy.py, torch.compile) reads them and writes fp32 logits (max), reads them and writes the
  exponentials (shift, exp, sums), divides them in place (the softmax kept for the backward), then reads the
  softmax and writes the bf16 gradient; the input- and weight-gradient GEMMs read it, the weight gradient
  accumulating in fp32 into `main_grad` (gradient-accumulation fusion).
- the chunked head (mlmclm/model/chunked_head.py), per chunk of c tokens: the logits GEMM into a bf16 buffer, the
  row max read from it, shifted into the fp32 buffer, exponentiated in place, summed, scaled into the bf16 gradient;
  the input-gradient GEMM, and the weight gradient's fp32-accumulating GEMM, which reads and writes the whole
  [V/TP, h] fp32 sum once per chunk: the term that falls as the chunk grows. At the end the sum is added into
  `main_grad`. `--wgrad bf16-product` models the head before issue 55 (a bf16 [V, h] product and its fp32 copy per
  chunk, and four more passes over the chunk's logits).
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

DEVICES = {  # dense bf16 FLOP/s (mlmclm.flops.PEAK_FLOPS) and HBM bandwidth, from NVIDIA's data sheets
    "h100": ("H100 SXM", 989e12, 3.35e12),
    "h200": ("H200", 989e12, 4.8e12),
}
BOUND = 1.2  # the chunked head may cost at most this much more than megatron's whole head


@dataclass
class Kernel:
    name: str
    flops: float
    bytes: float
    count: int = 1

    def seconds(self, flops_per_s: float, bytes_per_s: float) -> float:
        return self.count * max(self.flops / flops_per_s, self.bytes / bytes_per_s)


def _gemm(name: str, m: int, n: int, k: int, read: float, write: float, count: int = 1) -> Kernel:
    return Kernel(name, 2.0 * m * n * k, read + write, count)


def whole_head(tokens: int, vocab: int, hidden: int) -> list[Kernel]:
    t, v, h = tokens, vocab, hidden
    logits = t * v
    return [
        _gemm("logits GEMM", t, v, h, 2 * (t * h + v * h), 2 * logits),
        Kernel("fp32 logits + max", 0, 2 * logits + 4 * logits),
        Kernel("shift, exp, sums", 0, 4 * logits + 4 * logits),
        Kernel("softmax (in place)", 0, 8 * logits),
        Kernel("gradient to bf16", 0, 4 * logits + 2 * logits),
        _gemm("input-gradient GEMM", t, h, v, 2 * (logits + v * h), 2 * t * h),
        _gemm("weight-gradient GEMM into main_grad", v, h, t, 2 * (logits + t * h) + 4 * v * h, 4 * v * h),
    ]


def chunked_head(tokens: int, vocab: int, hidden: int, chunk: int, wgrad: str = "fp32-accumulate") -> list[Kernel]:
    v, h = vocab, hidden
    kernels = []
    full, rest = divmod(tokens, chunk)
    for c, count in ((chunk, full), (rest, 1 if rest else 0)):
        if not count:
            continue
        logits = c * v
        kernels += [
            _gemm(f"logits GEMM ({c})", c, v, h, 2 * (c * h + v * h), 2 * logits, count),
            Kernel(f"row max ({c})", 0, 2 * logits, count),
        ]
        if wgrad == "bf16-product":  # the head before issue 55: fp32 copy, in-place shift, and a copy back
            kernels.append(Kernel(f"fp32 copy, shift, exp, sum, scale, bf16 copy ({c})", 0, 42 * logits, count))
        else:
            kernels += [Kernel(f"shift into fp32 ({c})", 0, 6 * logits, count),
                        Kernel(f"exp in place + sum ({c})", 0, 12 * logits, count),
                        Kernel(f"scale into the bf16 gradient ({c})", 0, 6 * logits, count)]
        kernels.append(_gemm(f"input-gradient GEMM ({c})", c, h, v, 2 * (logits + v * h), 2 * c * h, count))
        if wgrad == "bf16-product":
            kernels += [_gemm(f"weight-gradient GEMM, bf16 product ({c})", v, h, c, 2 * (logits + c * h),
                              2 * v * h, count),
                        Kernel(f"product to fp32, added to the sum ({c})", 0, (2 + 4) * v * h + 12 * v * h, count)]
        else:
            kernels.append(_gemm(f"weight-gradient GEMM accumulating in fp32 ({c})", v, h, c,
                                 2 * (logits + c * h) + 4 * v * h, 4 * v * h, count))
    kernels.append(Kernel("sum added into main_grad", 0, 4 * v * h + 8 * v * h))
    return kernels


def totals(kernels: list[Kernel], flops_per_s: float, bytes_per_s: float) -> dict:
    return {"bytes": sum(k.count * k.bytes for k in kernels), "flops": sum(k.count * k.flops for k in kernels),
            "seconds": sum(k.seconds(flops_per_s, bytes_per_s) for k in kernels)}


def compare(tokens: int, vocab: int, hidden: int, chunk: int, gpu: str = "h100", wgrad: str = "fp32-accumulate"
            ) -> dict:
    """The chunked head at `chunk` against megatron's whole head, one micro-batch of `tokens` predicted tokens."""
    _, flops_per_s, bytes_per_s = DEVICES[gpu]
    whole = totals(whole_head(tokens, vocab, hidden), flops_per_s, bytes_per_s)
    chunked = totals(chunked_head(tokens, vocab, hidden, chunk, wgrad), flops_per_s, bytes_per_s)
    return {"chunk": chunk, "whole": whole, "chunked": chunked, "ratio": chunked["seconds"] / whole["seconds"]}


def smallest_chunk_within_bound(tokens: int, vocab: int, hidden: int, gpu: str = "h100", bound: float = BOUND
                                ) -> int:
    """The smallest power-of-two chunk whose head costs at most `bound` × megatron's whole head (memory grows
    with the chunk: its [chunk, V/TP] fp32 and bf16 logits)."""
    chunk = 64
    while compare(tokens, vocab, hidden, chunk, gpu)["ratio"] > bound and chunk < tokens:
        chunk *= 2
    return chunk


def main(argv=None) -> int:
    from mlmclm.model import preset
    from mlmclm.model.head_chunks import DEFAULT_CHUNK_TOKENS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="eurobert-1b")
    parser.add_argument("--tokens", type=int, default=10_339, help="predicted tokens in the micro-batch (CLM: all)")
    parser.add_argument("--gpu", choices=sorted(DEVICES), default="h100")
    parser.add_argument("--chunks", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    args = parser.parse_args(argv)
    cfg = preset(args.model)
    vocab, hidden = cfg.vocab_size, cfg.hidden_size
    name, _, _ = DEVICES[args.gpu]
    print(f"{args.model} (V {vocab}, h {hidden}), {args.tokens} predicted tokens per micro-batch, {name}, TP 1")
    base = compare(args.tokens, vocab, hidden, args.chunks[0], args.gpu)["whole"]
    print(f"  megatron's whole head: {base['bytes'] / 1e9:6.1f} GB moved, {base['flops'] / 1e12:5.2f} TFLOP, "
          f"{base['seconds'] * 1e3:5.1f} ms")
    for chunk in sorted(set(args.chunks) | {DEFAULT_CHUNK_TOKENS}):
        for wgrad in ("fp32-accumulate",) + (("bf16-product",) if chunk == 256 else ()):
            row = compare(args.tokens, vocab, hidden, chunk, args.gpu, wgrad)
            mark = "  <- the GPU default (DEFAULT_CHUNK_TOKENS)" if chunk == DEFAULT_CHUNK_TOKENS and \
                wgrad == "fp32-accumulate" else ""
            print(f"  chunked, {chunk:5d} tokens{' (before issue 55)' if wgrad == 'bf16-product' else '':<19}"
                  f"{row['chunked']['bytes'] / 1e9:6.1f} GB, {row['chunked']['seconds'] * 1e3:5.1f} ms, "
                  f"{row['ratio']:.2f}x the whole head{mark}")
    best = smallest_chunk_within_bound(args.tokens, vocab, hidden, args.gpu)
    print(f"  smallest chunk within {BOUND}x: {best} tokens"
          f" ({math.ceil(args.tokens / best)} chunks per micro-batch)")
    return 0


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
