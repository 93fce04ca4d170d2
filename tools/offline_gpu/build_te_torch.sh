#!/usr/bin/env bash
# Build transformer_engine_torch 2.20.2 (Transformer Engine's PyTorch extension) from its sdist, offline.
#
#   PYTHON=/path/to/venv/bin/python bash tools/offline_gpu/build_te_torch.sh SDIST [OUT_DIR=/tmp/te_built]
#
# Writes OUT_DIR/transformer_engine_torch-2.20.2-cp312-cp312-linux_x86_64.whl (and OUT_DIR/build.log).
#
# Needs a Python whose torch is the one the wheel will run against: 2.11.0+cu130 for the H200 image we saw.
# The extension is C++ only (33 .cpp files through torch's CppExtension, no .cu): no GPU and no CUDA compiler
# work is needed, only headers and an `nvcc` answering `nvcc -V`. Headers come, as torch's own libraries do,
# from NVIDIA's pip packages: TE's build looks in every site-packages/nvidia/*/include of that Python
# (cu13 for cuda_runtime.h / cublas_v2.h / nvrtc.h, cudnn, nccl, ...). README.md next to this file gives the
# steps that built our wheel on a CPU machine (a venv with torch 2.11.0 from PyPI, header directories linked in).
# On the GPU machine itself (torch and its nvidia-* packages installed, a CUDA toolkit in CUDA_HOME) the same
# script works as is: ~1-2 min with 16 cores; 21 min on 2 cores here.
set -euo pipefail
SDIST=${1:?usage: build_te_torch.sh SDIST [OUT_DIR]}
OUT=${2:-/tmp/te_built}
PY=${PYTHON:-python3}
SRC_PARENT=$(mktemp -d /tmp/te_torch_src.XXXXXX)
trap 'rm -rf "$SRC_PARENT"' EXIT

"$PY" - <<'PYTHON'
import sys
import torch, setuptools, wheel, pybind11  # noqa: F401  (all needed: the build runs without isolation)
print("torch", torch.__version__, "cuda", torch.version.cuda)
if not torch.__version__.startswith("2.11.0") or torch.version.cuda != "13.0":
    sys.exit("build against the device's torch: 2.11.0 with CUDA 13.0 (a torch mismatch fails at import there)")
PYTHON

# Every nvidia/*/include of that Python, then the toolkit's, for the header check and the compiler.
NV_INC=$("$PY" - <<'PYTHON'
import glob, os, nvidia
print(":".join(d for root in nvidia.__path__ for d in sorted(glob.glob(os.path.join(root, "*", "include")))))
PYTHON
)
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
export CUDA_HOME
export CPLUS_INCLUDE_PATH="$CUDA_HOME/include:$NV_INC${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
echo "CUDA_HOME=$CUDA_HOME"
for header in cuda_runtime.h cudnn.h nccl.h cublas_v2.h nvrtc.h; do
  found=""
  IFS=: read -ra dirs <<<"$CPLUS_INCLUDE_PATH"
  for dir in "${dirs[@]}"; do [ -f "$dir/$header" ] && found=$dir && break; done
  echo "  $header -> ${found:-MISSING}"
  [ -n "$found" ] || { echo "header $header not found: see README.md (CUDA headers from pip packages)" >&2; exit 2; }
done

export NVTE_PYTORCH_FORCE_BUILD=TRUE   # never try to download a prebuilt wheel from GitHub
export NVTE_NO_LOCAL_VERSION=1         # version must be exactly 2.20.2: TE asserts it equals the core's
export NVTE_CUDA_ARCHS=90              # Hopper only (the extension has no device code, but TE reads it)
export NVTE_WITH_NCCL_EP=0             # expert-parallel NCCL path: unused, and skips nccl device-API headers
export MAX_JOBS=${MAX_JOBS:-$(nproc)}

mkdir -p "$OUT"
tar -xzf "$SDIST" -C "$SRC_PARENT"
cd "$SRC_PARENT"/transformer_engine_torch-*
start=$(date +%s)
"$PY" -m pip wheel -v --no-index --no-deps --no-build-isolation --no-cache-dir -w "$OUT" . > "$OUT/build.log" 2>&1 \
  || { tail -60 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s:"
ls -la "$OUT"/transformer_engine_torch-*.whl
