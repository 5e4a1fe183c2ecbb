#!/usr/bin/env bash
# Wheels for scripts/gpu_check.sh on a GPU machine that reaches no package index (WHEELS=<folder>).
#
#   bash scripts/gpu_wheels.sh [folder]      # default .whl; run from the repository root after `make install`
#
# The machine brings Python 3.12 with CUDA builds of torch and transformers (and numpy, pandas, pyarrow,
# requests, httpx, matplotlib, networkx, tqdm, pyyaml, psutil, ...). The packages below are the rest of what
# the stages import on the BabyAI micro config with HF rollouts and DeepSpeed, and the benchmarks import;
# the list was read from the modules those processes had loaded at exit. Each comes at the version this
# checkout's .venv holds, as a CPython 3.12 manylinux wheel, or built here when only a source archive
# exists (pure Python; DeepSpeed with DS_BUILD_OPS=0, its ops compiled on first use). vLLM is not among
# them: its wheels (about 400 MB with its CUDA kernels) are too large to carry.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.whl}
PY=${PY:-.venv/bin/python}
PACKAGES="annotated-types antlr4-python3-runtime atpublic brotli configobj cryptography datasets
  deepspeed dill diskcache dpath dulwich dvc dvc-data dvc-http dvc-objects dvc-render dvc-studio-client dvclive
  Farama-Notifications flatten-dict flufl.lock funcy gymnasium h2 hjson hpack httpcore2 httpx2 hydra-core
  hyperframe minigrid more-itertools multiprocess omegaconf opentelemetry-api orjson platformdirs pydantic
  pydantic_core pydot pygame-ce pygtrie pytz redis ruamel.yaml scmrepo sniffio sqltrie truststore
  typing-inspection voluptuous wcwidth zc.lockfile"
mkdir -p "$OUT"
for name in $PACKAGES; do
  version=$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      -d "$OUT" "$name==$version" 2>/dev/null ||
    DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$OUT" "$name==$version"
done
# a wheel built here for this Python's ABI would not install on the machine's 3.12
if ls "$OUT"/*.whl | grep -v -E -e '-(py2\.)?py3-none-|-py312-none-|-cp312-|-abi3-'; then
  echo "^ wheels for another Python than 3.12: remove them and find 3.12 builds" >&2
  exit 1
fi
ls "$OUT" | wc -l
du -sh "$OUT"
