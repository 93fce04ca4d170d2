"""The demo's CPU kernels pinned to one code path per library, and the name of the host a figure was measured on.

torch picks its own vectorised kernels (ATen), MKL its matrix products and oneDNN its primitives by the CPU they
find. Each sums in its own order, and the demo's training is chaotic enough that one bit decides its figures:
measured, the same code with MKL's SSE2 products instead of its AVX2 ones gave the same CLM phase to the third
decimal, then MLM losses of 5.751 and 5.664 and a final fill-mask loss of 6.34 and 6.33. So each library that
computes a training number takes one code path whatever the host offers:

- ATen: `ATEN_CPU_CAPABILITY=avx2` (every x86-64 CPU of the last decade has AVX2).
- MKL, which does all of torch's fp32 matrix products here (`MKL_VERBOSE=1` lists only SGEMM / SGEMM_BATCH calls
  in a training run): `MKL_CBWR=COMPATIBLE`, its SSE2 branch without the approximate reciprocals whose results
  differ between vendors. Its AVX2 branch is honoured on Intel CPUs only (oneMKL developer guide, "Getting Started
  with Conditional Numerical Reproducibility"); COMPATIBLE is honoured on AMD too: measured on an AMD EPYC, every
  product of a training run reports `CNR:COMPATIBLE`, and with MKL's vendor test forced to answer "Intel" (its
  exported `mkl_serv_intel_cpu_true`, interposed) COMPATIBLE's products stay bit-identical while the default
  branch's change. It costs speed on large products (2.2-2.8x on hidden-128 shapes in isolation); the demo's model
  is small enough that its time is mostly elsewhere.
- oneDNN: `ONEDNN_MAX_CPU_ISA=AVX2` (no call in an fp32 training run, `ONEDNN_VERBOSE=1`; kept for the paths that
  use it).

That makes every run on one host give the same figures, and two AMD EPYC generations (family 25 model 17 and
family 26 model 2) give the same figures bit for bit. It does not make Intel and AMD equal: at 5708c97 an Intel
Xeon (family 6 model 207) and those AMD hosts agree on the CLM phase and the random-init figures, then move apart
(MLM loss 5.751 / 5.705). The smoke scores of the random-init export, fine-tuned in the demo's own process, are equal
on both; the drift starts in the training processes. Its source is not found: MKL, as above, is ruled out; the
next suspects, code that picks a variant by the CPU it finds with no override (glibc's libm), cannot be tested
without an Intel host. mlmclm/demo_figures.py therefore checks the figures exactly on the README's host and within
a measured spread elsewhere.

MKL's reproducibility also needs the same thread count: our CPU runs use 1 thread per training process and the
2 cores both machines have in the demo's own process. `pin()` must run before torch is first used in the process;
the launched training processes inherit it from the environment. A value the user set is kept. Importing this
module does not import torch. `host()` names the CPU a run measured on, so a figure that differs can be traced.
"""
from __future__ import annotations

import os
from pathlib import Path

PINNED = {
    "ATEN_CPU_CAPABILITY": "avx2",   # torch's own vectorised kernels (softmax, norms, reductions, elementwise)
    "MKL_CBWR": "COMPATIBLE",        # MKL's matrix products (torch's fp32 matmul on x86), any CPU vendor
    "ONEDNN_MAX_CPU_ISA": "AVX2",    # oneDNN's primitives
}


def pin() -> dict[str, str]:
    """Set each variable of PINNED unless already set; return the values now in force."""
    for name, value in PINNED.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in PINNED}


def host(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """'<vendor>, <model name> (family F model M), N CPUs, AVX-512 yes|no', or 'unknown' where /proc is absent."""
    try:
        fields = {}
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() not in fields:
                fields[key.strip()] = value.strip()
    except OSError:
        return "unknown"
    avx512 = "yes" if "avx512f" in fields.get("flags", "").split() else "no"
    return (f"{fields.get('vendor_id', '?')}, {fields.get('model name', '?')} (family {fields.get('cpu family', '?')}"
            f" model {fields.get('model', '?')}), {os.cpu_count()} CPUs, AVX-512 {avx512}")
