#!/usr/bin/env bash
# RL algorithm / reward ablation on the default recipe, after `make run` has built data/:
# the same SFT model and games, one RL run per setting, then the RL policy on the test games
# of every level. Results land in ${OUT:-data/ablations}/<algo>_<reward>/eval/metrics.json.
#   bash scripts/ablate_rl.sh                      # grpo/rloo/ppo/reinforce_pp, sparse, and grpo dense
#   bash scripts/ablate_rl.sh ppo:dense rloo:sparse
# (`dvc exp run -S rl=X -S reward=Y` gives the same RL run plus every stage downstream.)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH" TORCH_EXTENSIONS_DIR="$PWD/.cache/torch_extensions" AGENTRECIPE_THREADS="${AGENTRECIPE_THREADS:-1}"
OUT=${OUT:-data/ablations}
specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=(rloo:sparse ppo:sparse reinforce_pp:sparse grpo:dense)
for spec in "${specs[@]}"; do
  algo=${spec%%:*}; reward=${spec##*:}; d="$OUT/${algo}_${reward}"
  mkdir -p "$d"
  python -m agentrecipe.cli compose-params "rl=$algo" "reward=$reward" --output "$d/params.yaml" > /dev/null
  t0=$(date +%s)
  python -m stages.rl --params "$d/params.yaml" --envs data/envs --model data/models/sft --out "$d/model" \
      --checkpoints "$d/ckpt" --metrics "$d/metrics" > "$d/rl.log" 2>&1
  t1=$(date +%s)
  python -m agentrecipe.cli evaluate --model "$d/model" --games data/envs --params "$d/params.yaml" --out "$d/eval" > "$d/eval.log" 2>&1
  echo "$algo/$reward: rl $((t1 - t0)) s, eval $(( $(date +%s) - t1 )) s"
  grep '^| w' "$d/eval.log" || true
done
