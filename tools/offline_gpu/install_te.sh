#!/usr/bin/env bash
# On the offline GPU machine: install the base wheels and Transformer Engine 2.20.2 into SITE in ONE pip call,
# then run a TE smoke test (bf16 and FP8 Linear forward/backward). benchmarks/gpu_session.sh does the same
# install as its first step; this script is for installing TE alone, by hand.
#
#   bash tools/offline_gpu/install_te.sh WHEEL_DIR CORE_DIR [SITE=/tmp/site]
#   export PYTHONPATH=SITE:$PYTHONPATH
#
# WHEEL_DIR  the base wheels (download_wheels.sh); WHEEL_DIR/te the TE metapackage, the prebuilt
#            transformer_engine_torch wheel and its sdist (built here with build_te_torch.sh when no wheel is there)
# CORE_DIR   the shrunk transformer_engine_cu13 wheel (shrink_te_core.py), e.g. .tecore
#
# One call because of --target --upgrade: a second call replaces the whole transformer_engine/ directory and
# drops the files the other TE wheels put there.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WHEELS=${1:?usage: install_te.sh WHEEL_DIR CORE_DIR [SITE]}
CORE_DIR=${2:?usage: install_te.sh WHEEL_DIR CORE_DIR [SITE]}
SITE=${3:-/tmp/site}
PY=${PYTHON:-python3}
TE_VERSION=2.20.2

CORE=$(ls "$CORE_DIR"/transformer_engine_cu13-$TE_VERSION-*.whl 2>/dev/null | head -1 || true)
[ -n "$CORE" ] || { echo "no transformer_engine_cu13-$TE_VERSION wheel in $CORE_DIR" >&2; exit 2; }

TORCH_EXT=$(ls "$WHEELS"/te/transformer_engine_torch-$TE_VERSION-*.whl 2>/dev/null | head -1 || true)
if [ -z "$TORCH_EXT" ]; then
  echo "no prebuilt transformer_engine_torch wheel: building it from the sdist against this machine's torch"
  bash "$HERE/build_te_torch.sh" "$WHEELS/te/transformer_engine_torch-$TE_VERSION.tar.gz" /tmp/te_built
  TORCH_EXT=$(ls /tmp/te_built/transformer_engine_torch-$TE_VERSION-*.whl | head -1)
fi

"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
  "$WHEELS"/*.whl "$WHEELS/te/transformer_engine-$TE_VERSION-py3-none-any.whl" "$TORCH_EXT" "$CORE"

PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$HERE/../../benchmarks/te_smoke.py"
