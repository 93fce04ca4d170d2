#!/usr/bin/env bash
# All GPU checks in one go on a bare, offline GPU machine (one H100/H200), within ~11 minutes (estimated: the
# determinism comparison has not run on a GPU; a 10-minute device command may cut the last check, gpu_train_check):
#   1. install carried wheels (megatron-core and what the image lacks; Transformer Engine if carried) in ONE pip call
#      (with --target, a second call would replace transformer_engine/ and drop the other wheel's half of it);
#   2. a Transformer Engine smoke test (bf16 and FP8 Linear forward/backward), when TE was carried;
#   3. benchmarks/gpu_check.py: tokens/s, MFU and memory, features on vs off, host syncs per step, bf16 vs fp32
#      losses, then two same-seed deterministic runs and a stop/resume compared step by step (first: an earlier
#      session ran out of device time before its speed table);
#   4. benchmarks/gpu_train_check.py: torchrun/NCCL preemption and exact resume, export, per-document attention,
#      TE keys and FP8 runs.
#
#   bash benchmarks/gpu_session.sh OUT_DIR [WHEEL_DIR ...]      # e.g. OUT_DIR=$OUT, wheels in .whl .whl/te .tecore
#
# With no WHEEL_DIR the Python in use must already have mlmclm's dependencies (e.g. the NGC image of cluster/).
# Reports land in OUT_DIR: gpu_train_check.json/.log, gpu_check.json/.log, session.log.
set -u
OUT=${1:?usage: gpu_session.sh OUT_DIR [WHEEL_DIR ...]}
shift
mkdir -p "$OUT"
exec > >(tee "$OUT/session.log") 2>&1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
SITE=/tmp/mlmclm_site
start=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - start )) s] $*"; }

if [ $# -gt 0 ]; then
  wheels=()
  for dir in "$@"; do for w in "$dir"/*.whl; do [ -f "$w" ] && wheels+=("$w"); done; done
  elapsed "installing ${#wheels[@]} wheels into $SITE"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}" \
    || { echo "wheel installation failed"; exit 3; }
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi

# Transformer Engine loads cuDNN itself (CUDNN_PATH, else the system's) before torch does; a system cuDNN older
# than the one torch was built with then fails torch's version check. Point TE at torch's own (pip) cuDNN.
if [ -z "${CUDNN_PATH:-}" ]; then
  CUDNN_PATH=$("$PY" -c "import nvidia.cudnn as c; print(list(c.__path__)[0])" 2>/dev/null) && export CUDNN_PATH \
    && echo "CUDNN_PATH=$CUDNN_PATH"
fi

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
"$PY" - <<'EOF'
import importlib.metadata as md
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
      "device", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
for name in ("megatron-core", "transformer_engine", "transformer_engine_torch", "transformers", "webdataset"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "absent")
EOF

if [ -z "${SKIP_TE_SMOKE:-}" ] && "$PY" -c "import transformer_engine" 2>/dev/null; then
  elapsed "Transformer Engine smoke test"
  timeout 120 "$PY" benchmarks/te_smoke.py
fi

train_check() {
  elapsed "gpu_train_check"
  timeout "${TRAIN_CHECK_TIMEOUT:-250}" "$PY" benchmarks/gpu_train_check.py --out /tmp/gpu_train_check \
    ${TRAIN_CHECK_ARGS:-} > "$OUT/gpu_train_check.log" 2>&1
  echo "gpu_train_check exit $?"
  grep -E '^\[(PASS|FAIL)\]|checks passed' "$OUT/gpu_train_check.log"
  cp /tmp/gpu_train_check/report.json "$OUT/gpu_train_check.json" 2>/dev/null
}

speed_check() {
  elapsed "gpu_check"
  timeout "${GPU_CHECK_TIMEOUT:-420}" "$PY" benchmarks/gpu_check.py --json "$OUT/gpu_check.json" \
    --seq-lengths 2048 --budget-s "${GPU_CHECK_BUDGET:-230}" --seconds-per-run 10 ${GPU_CHECK_ARGS:-} \
    > "$OUT/gpu_check.log" 2>&1
  echo "gpu_check exit $?"
  tail -40 "$OUT/gpu_check.log"
}

# The speed table (and the determinism comparison) first; TRAIN_CHECK_FIRST=1 runs the correctness checks first.
if [ -n "${TRAIN_CHECK_FIRST:-}" ]; then train_check; speed_check; else speed_check; train_check; fi
elapsed "done"
