#!/usr/bin/env bash
# Everything we need from one GPU device command (at most 600 s on one H100/H200), in sections, most valuable first.
#
#   bash benchmarks/gpu_session.sh OUT_DIR [WHEEL_DIR ...]      # e.g. OUT_DIR=$OUT, wheels in .whl .whl/te .tecore
#
# The plan, with each section's timeout and what it brings back, is benchmarks/gpu_session.py's SECTIONS:
# environment, speed_bf16 (the training default: chunked head, random-length THD with the fused RoPE, bf16),
# speed_fp8 (tensorwise, delayed, FP8 attention where the gate allows it), memory (worst case against --plan's
# estimate), determinism (exact resume, same-seed runs), train_check (torchrun/NCCL preemption, FP8 checkpoints,
# export), features (the rest). Every timeout, its kill-after and this script's own steps add up to at most
# gpu_session.BUDGET_S = 540 s (tests/benchmarks/test_gpu_session.py checks it).
#
# Each section runs in its own process under `timeout` (SIGTERM, then SIGKILL, to its whole process group), stops
# itself before its timeout (benchmarks/gpu_deadline.py: "not reached", never "failed") and writes
# OUT_DIR/<section>.json the moment it ends (and after every piece of work it can cut); OUT_DIR/summary.json says at
# every moment which sections ended, how long they took, and which did not run. A kill at any moment leaves all
# finished sections on disk. OUT_DIR holds nothing else (the device returns at most 8 files): logs go to
# $GPU_SESSION_WORK/logs (each section's JSON carries its log's tail), as do the install status and scratch.
#
# With WHEEL_DIR(s), their wheels are installed in ONE pip call into /tmp/mlmclm_site (with --target a second call
# would replace transformer_engine/ and drop the other wheel's half of it); without, the Python in use must already
# have mlmclm's dependencies (e.g. the NGC image of cluster/). Without CUDA every section runs its CPU dry-run
# shapes: that is how this script is tested.
set -u
OUT=${1:?usage: gpu_session.sh OUT_DIR [WHEEL_DIR ...]}
shift
mkdir -p "$OUT"
export GPU_SESSION_WORK=${GPU_SESSION_WORK:-$(mktemp -d /tmp/mlmclm_gpu_session.XXXXXX)}
LOGS=$GPU_SESSION_WORK/logs
mkdir -p "$LOGS"
exec > >(tee -a "$LOGS/session.log") 2>&1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
SITE=/tmp/mlmclm_site
began=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - began )) s] $*"; }

# The plan (stdlib only): summary.json lists every section as "not run" until it runs.
plan=$(timeout 5 "$PY" "$HERE/gpu_session.py" start "$OUT") || { echo "could not start the session in $OUT"; exit 3; }
kill_after=$(awk '$1 == "kill_after" {print $2}' <<< "$plan")
margin=$(awk '$1 == "margin" {print $2}' <<< "$plan")
cudnn=$(awk '$1 == "env" {sub(/^env CUDNN_PATH=/, ""); print}' <<< "$plan")
# Transformer Engine loads cuDNN itself (CUDNN_PATH, else the system's) before torch does; a system cuDNN older
# than torch's then fails torch's version check. Point TE at torch's own (pip) cuDNN.
[ -n "$cudnn" ] && export CUDNN_PATH="$cudnn" && echo "CUDNN_PATH=$CUDNN_PATH"

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
install_timeout=$(awk '$1 == "install" {print $3}' <<< "$plan")
if [ $# -gt 0 ]; then
  wheels=()
  for dir in "$@"; do for w in "$dir"/*.whl; do [ -f "$w" ] && wheels+=("$w"); done; done
  elapsed "installing ${#wheels[@]} wheels into $SITE (timeout $install_timeout s)"
  t0=$(date +%s)
  timeout -k "$kill_after" "$install_timeout" "$PY" -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target "$SITE" "${wheels[@]}"
  rc=$?
  status=ok; [ $rc -eq 0 ] || status="failed (exit $rc)"
  printf '{"status": "%s", "seconds": %d, "wheels": %d}\n' "$status" $(( $(date +%s) - t0 )) ${#wheels[@]} \
    > "$GPU_SESSION_WORK/install.json"
  [ $rc -eq 0 ] || { echo "wheel installation failed (exit $rc): nothing else can run"; exit 3; }
  export PYTHONPATH="$SITE:$PYTHONPATH"
else
  printf '{"status": "not needed", "seconds": 0, "wheels": 0}\n' > "$GPU_SESSION_WORK/install.json"
fi

while read -r kind name seconds; do
  [ "$kind" = section ] || continue
  elapsed "section $name (timeout $seconds s)"
  timeout -k "$kill_after" "$seconds" "$PY" "$HERE/gpu_session.py" run "$name" --out "$OUT" \
    --budget-s $(( seconds - margin )) < /dev/null > "$LOGS/$name.log" 2>&1
  rc=$?
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && echo "$name: stopped by its timeout ($seconds s)"
  tail -n 3 "$LOGS/$name.log"
done <<< "$plan"
elapsed "done"
timeout 5 "$PY" "$HERE/gpu_session.py" finish "$OUT"
