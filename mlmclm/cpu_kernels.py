"""The same CPU numbers on every x86-64 machine: each library's kernels pinned to one instruction set.

torch picks its own vectorised kernels (ATen), MKL its matrix products and oneDNN its primitives by the CPU they
find. Each sums in its own order, and the demo's training is chaotic enough that one bit decides its figures:
measured, the same code with MKL's SSE2 products instead of its AVX2 ones gave the same CLM phase to the third
decimal, then MLM losses of 5.751 and 5.664 and a final fill-mask loss of 6.34 and 6.33. So every library that
computes a training number must take the same code path on every host:

- ATen: `ATEN_CPU_CAPABILITY=avx2` (every x86-64 CPU of the last decade has AVX2).
- MKL, which does all of torch's fp32 matrix products here (`MKL_VERBOSE=1` lists only SGEMM / SGEMM_BATCH calls
  in a training run): `MKL_CBWR=COMPATIBLE`. MKL's AVX2 branch is reproducible on *Intel* CPUs only; on another
  vendor's CPU MKL ignores it and dispatches as usual (oneMKL developer guide, "Getting Started with Conditional
  Numerical Reproducibility"). We take that to be why CI's host, twice as fast as ours, gave MLM 5.694 against our
  5.664 with the AVX2 pin (not yet confirmed: `.ci/run` now prints the host's CPU first). COMPATIBLE is MKL's SSE2 branch without the approximate reciprocal instructions whose
  results differ between vendors. It costs speed on large products (2.2-2.8x on hidden-128 shapes in isolation);
  the demo's model is small enough that its time is mostly elsewhere.
- oneDNN: `ONEDNN_MAX_CPU_ISA=AVX2` (no call in an fp32 training run, `ONEDNN_VERBOSE=1`; kept for the paths that
  use it).

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
