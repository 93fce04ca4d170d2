"""The same CPU numbers on every x86-64 machine: the kernels' instruction set pinned to AVX2.

torch picks its own vectorised kernels (ATen), MKL its matrix products and oneDNN its primitives by the CPU they
find: AVX-512 on one host, AVX2 on another. Each sums in its own order, so the same seed gives results that differ
in the last bits, and over 400 training steps and 100 fine-tuning steps those bits grow into different losses and
F1 scores. Measured: `make demo` on two 2-core hosts (ours and CI's, both "Intel Xeon Processor") gave the same CLM
phase but MLM losses of 5.686 and 5.690 and a random-init QA F1 of 85.0 and 82.4; on one host, pinning AVX2 moved
the fill-mask loss of the untrained model from 9.072893606 to 9.072893732.

`pin()` asks all three for AVX2 (which every x86-64 CPU of the last decade has), so a run whose numbers are
published (the demo's README paragraph, CI's check of it) is the same wherever it runs. MKL's conditional numerical
reproducibility (MKL_CBWR) also needs the same thread count: our CPU runs use the 2 cores both machines have. It
must run before torch is first used in the process; the launched training processes inherit it from the
environment. A value the user set is kept. Importing this module does not import torch.
"""
from __future__ import annotations

import os

PINNED = {
    "ATEN_CPU_CAPABILITY": "avx2",   # torch's own vectorised kernels (softmax, norms, reductions, elementwise)
    "MKL_CBWR": "AVX2",              # MKL's matrix products (torch's fp32 matmul on x86)
    "ONEDNN_MAX_CPU_ISA": "AVX2",    # oneDNN's primitives
}


def pin() -> dict[str, str]:
    """Set each variable of PINNED unless already set; return the values now in force."""
    for name, value in PINNED.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in PINNED}
