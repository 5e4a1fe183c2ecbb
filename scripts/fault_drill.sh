#!/usr/bin/env bash
# The fault table of issue 13, rerun on the micro config in a scratch copy of this project:
#   scripts/fault_drill.sh [SCRATCH_DIR]        (default: a new folder under /tmp)
#   ONLY="3 6" scripts/fault_drill.sh DIR       only those rows (again in DIR: the reference is reused)
# Each row injects one fault into `dvc repro` (or `agentrecipe evaluate`), then prints what was
# expected and what happened. The reference is an unbroken run of the same config: a resumed
# run must end with byte-identical RL weights. Every process it starts runs in its own process
# group, recorded and killed by that id (on exit too). Takes 15-30 minutes on 2 busy cores.
set -uo pipefail

SRC="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-$(mktemp -d /tmp/fault_drill.XXXXXX)}"
VENV="${VENV:-$SRC/.venv}"
export PATH="$VENV/bin:$PATH" HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false DO_NOT_TRACK=1 DVC_NO_ANALYTICS=1 \
       AGENTRECIPE_THREADS=1 TORCH_EXTENSIONS_DIR="$SRC/.cache/torch_extensions" \
       DVC_SITE_CACHE_DIR="$WORK/.cache/dvc-site"
unset RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT
OVERRIDES=(experiment=micro rl.checkpoint_every=1)   # 20 RL episodes: 5 steps, a checkpoint after each

GROUPS_STARTED=()
cleanup() { for g in "${GROUPS_STARTED[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done; }
trap cleanup EXIT

ROWS=()
row() {  # fault | expected | what happened | PASS/FAIL
    ROWS+=("$1|$2|$3|$4")
    printf '\n== %s\n   expected: %s\n   happened: %s\n   -> %s\n' "$1" "$2" "$3" "$4"
}
log() { printf '%s %s\n' "$(date +%H:%M:%S)" "$*"; }

# --- the scratch project: tracked and untracked files of this checkout, its own git and DVC state
mkdir -p "$WORK" && cd "$WORK" || exit 1
if [ ! -f dvc.yaml ]; then
    (cd "$SRC" && git ls-files -co --exclude-standard -z) | while IFS= read -r -d '' f; do
        [ -f "$SRC/$f" ] && mkdir -p "$(dirname "$f")" && cp -p "$SRC/$f" "$f"
    done
    git init -q && git add -A && git -c user.name=drill -c user.email=drill@example.com commit -qm drill
fi
python -m agentrecipe.cli compose-params "${OVERRIDES[@]}" >/dev/null || exit 1
log "scratch project: $WORK"

CKPTS=data/rl/checkpoints
model_hash() { sha256sum data/models/rl/model.safetensors 2>/dev/null | cut -c1-16; }
steps() { tail -n +2 data/metrics/rl/plots/metrics/rollout/success.tsv 2>/dev/null | cut -f1 | paste -sd, -; }
# the current config's checkpoint folder (once a code change made a second one, the first listed was
# not always it: row 6 corrupted the other config's checkpoint)
fp_dir() { echo "$CKPTS/$(python -c 'from stages.rl import rl_fingerprint; print(rl_fingerprint())')"; }

want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }
start_bg() {  # start a command in its own process group; sets PGID, output to $1
    local out=$1; shift
    # A background job of a script ignores SIGINT (bash, no job control), and Python keeps it ignored:
    # restore the default first, so SIGINT reaches the stage as a Ctrl-C does.
    setsid python -c 'import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); os.execvp(sys.argv[1], sys.argv[1:])' \
        "$@" >"$out" 2>&1 &
    PGID=$!
    GROUPS_STARTED+=("$PGID")
}
wait_for() {  # wait_for GLOB [timeout]: until a path matching GLOB exists (0) or the process ended (1)
    local deadline=$(( $(date +%s) + ${2:-900} ))
    while [ "$(date +%s)" -lt "$deadline" ]; do
        compgen -G "$1" >/dev/null && return 0
        kill -0 "$PGID" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}
stop_group() { kill "-$1" -- "-$PGID" 2>/dev/null; wait "$PGID" 2>/dev/null; }
fresh_rl() { rm -rf "$CKPTS"; }   # the next rl run starts from step 0

# --- 0. the reference: an unbroken run of the whole DAG
log "reference run: dvc repro"
if ! dvc repro >ref.log 2>&1; then tail -30 ref.log; echo "reference run failed"; exit 1; fi
REF=$(model_hash); REF_STEPS=$(steps)
cp data/eval/metrics.json ref_metrics.json
log "reference: rl weights $REF, steps $REF_STEPS"
check_same() {  # check_same LOG: the rl model and curve match the reference
    local h s; h=$(model_hash); s=$(steps)
    [ "$h" = "$REF" ] && [ "$s" = "$REF_STEPS" ] && echo "weights $h = reference, steps $s" && return 0
    echo "weights $h (reference $REF), steps $s (reference $REF_STEPS)"; return 1
}

# --- 1. kill -9 mid-step
if want 1; then
fresh_rl
start_bg kill9.log dvc repro -f -s rl
# a moment into step 3 (an idle 2-core machine runs a micro step in 0.5-0.8 s: after 1.5 s the
# run had finished, and the row failed with nothing to resume)
wait_for "$CKPTS/*/step_000002/checkpoint.json"; sleep 0.2; stop_group KILL
dvc repro rl >kill9_rerun.log 2>&1; rc=$?
got="rerun rc $rc; $(grep -o 'resumed from .*' kill9_rerun.log | head -1); $(check_same)"
[ $rc = 0 ] && grep -q "resumed from" kill9_rerun.log && check_same >/dev/null && r=PASS || r=FAIL
row "kill -9 mid-step (after checkpoint 2)" "dvc repro resumes from the last checkpoint; weights and curve = unbroken run" "$got" $r
fi

# --- 2. kill -9 mid checkpoint write
if want 2; then
fresh_rl
start_bg kill9w.log dvc repro -f -s rl
caught=no
if wait_for "$CKPTS/*/step_00000[2-4].tmp"; then stop_group KILL; caught=yes; else wait "$PGID"; fi
left=$(ls -d "$CKPTS"/*/step_* 2>/dev/null | xargs -n1 basename | paste -sd, -)
dvc repro rl >kill9w_rerun.log 2>&1; rc=$?
got="caught a write: $caught (left: $left); rerun rc $rc; $(grep -o 'resumed from .*' kill9w_rerun.log | head -1); $(check_same)"
[ $rc = 0 ] && [ $caught = yes ] && check_same >/dev/null && r=PASS || r=FAIL
row "kill -9 mid checkpoint write" "the half-written step_N.tmp is never resumed; rerun resumes from the previous one; weights = unbroken" "$got" $r
fi

# --- 3. SIGINT (Ctrl-C)
if want 3; then
fresh_rl
start_bg sigint.log dvc repro -f -s rl
wait_for "$CKPTS/*/step_000002/checkpoint.json"; sleep 1; stop_group INT
sleep 5; kill -KILL -- "-$PGID" 2>/dev/null
dvc repro rl >sigint_rerun.log 2>&1; rc=$?
got="rerun rc $rc; $(grep -o 'resumed from .*' sigint_rerun.log | head -1); $(check_same)"
[ $rc = 0 ] && grep -q "resumed from" sigint_rerun.log && check_same >/dev/null && r=PASS || r=FAIL
row "SIGINT mid-run" "the stage stops; dvc repro resumes; weights and curve = unbroken run" "$got" $r
fi

# --- 4. dvc repro -f on a finished run
if want 4; then
dvc repro -f rl >force.log 2>&1; rc=$?
metric_step=$(python -c "import json; print(json.load(open('data/metrics/rl/metrics.json'))['step'])")
got="rc $rc; $(grep -o 'already trained all [0-9]* steps' force.log | head -1); metrics.json step $metric_step; $(check_same)"
[ $rc = 0 ] && grep -q "already trained all" force.log && [ "$metric_step" = 5 ] && check_same >/dev/null && r=PASS || r=FAIL
row "dvc repro -f rl (run already finished)" "says the config already trained all steps (how to retrain); model and curves kept, metrics.json step 5 (not 0)" "$got" $r
fi

# --- 5. a code change, then dvc repro
if want 5; then
old_fp=$(basename "$(fp_dir)")
cp agentrecipe/rewards.py rewards.py.orig
echo "# drill: a change to the code of the rl stage" >>agentrecipe/rewards.py
dvc repro rl >code.log 2>&1; rc=$?
n_fp=$(ls -d "$CKPTS"/*/ | wc -l)
kept=$(ls "$CKPTS/$old_fp" | grep -cE '^step_[0-9]+$')
got="rc $rc; $(grep -o 'steps 1\.\.5 of 5 ([0-9]* episodes this run)' code.log); resumed: $(grep -c 'resumed from' code.log); $n_fp config folders, old one keeps $kept checkpoints"
[ $rc = 0 ] && grep -q "steps 1\.\.5 of 5" code.log && ! grep -q "resumed from" code.log && [ "$kept" = 2 ] && r=PASS || r=FAIL
row "code change, then dvc repro" "a new fingerprint: trains all 5 steps from 0; the old config's checkpoints are left alone" "$got" $r
mv rewards.py.orig agentrecipe/rewards.py
dvc repro rl >code_back.log 2>&1
row "code change undone, then dvc repro" "the old fingerprint again: its finished run is written out, no step trained" \
    "$(grep -o 'already trained all [0-9]* steps' code_back.log | head -1); $(check_same)" \
    "$(grep -q 'already trained all' code_back.log && check_same >/dev/null && echo PASS || echo FAIL)"
fi

# --- 6. a corrupt checkpoint file
if want 6; then
d=$(fp_dir)
states=$(ls "$d"/step_000005/actor_state/state/*model_states.pt | head -1)
head -c 1000 "$states" >"$states.cut" && mv "$states.cut" "$states"
dvc repro -f -s rl >corrupt.log 2>&1; rc=$?
got="rc $rc; $(grep -o 'step_000005 skipped: corrupt, [^;]*' corrupt.log | head -1); $(grep -o 'resumed from .*' corrupt.log | head -1); $(check_same)"
[ $rc = 0 ] && grep -q "skipped: corrupt" corrupt.log && grep -q "resumed from.*step_000004" corrupt.log && check_same >/dev/null && r=PASS || r=FAIL
row "truncated mp_rank_00_model_states.pt in the newest checkpoint" "reported (file named), moved aside; resumes from step 4; weights = unbroken" "$got" $r
fi

# --- 7. a killed environment worker
if want 7; then
fresh_rl
start_bg worker.log dvc repro -f -s rl
wait_for "$CKPTS/*/step_000001/checkpoint.json"
victim=$(pgrep -g "$PGID" -f "multiprocessing.spawn" | head -1)
[ -n "$victim" ] && kill -KILL "$victim"
wait "$PGID"; rc=$?
got="killed worker pid ${victim:-none}; rc $rc; $(grep -o '[0-9]* env failures' worker.log | tail -1); $(check_same)"
[ $rc = 0 ] && [ -n "$victim" ] && grep -q " 0 env failures" worker.log && check_same >/dev/null && r=PASS || r=FAIL
row "kill -9 of one environment worker mid-run" "the pool restarts it and replays its episodes: 0 failed episodes, weights = unbroken" "$got" $r
fi

# --- 8. a corrupt game in an evaluation folder
if want 8; then
rm -rf drill_games && mkdir drill_games
cp data/envs/*/test/*.z8 data/envs/*/test/*.json drill_games/
victim=$(ls drill_games/*.z8 | head -1)
head -c 100000 "$victim" >"$victim.cut" && mv "$victim.cut" "$victim"
n=$(ls drill_games/*.z8 | wc -l)
python -m agentrecipe.cli evaluate --model expert data/models/rl --games drill_games --out drill_eval >eval.log 2>&1; rc=$?
played=$(python -c "import json; print(len({json.loads(l)['game'] for l in open('drill_eval/episodes.jsonl')}))" 2>/dev/null)
got="rc $rc; $(grep -o "left out [^ ]*$(basename "$victim"): it does not start ([^)]*)" eval.log | head -1 | cut -c1-160); played $played of $n games"
[ $rc = 0 ] && grep -q "left out.*$(basename "$victim")" eval.log && [ "$played" = $((n - 1)) ] && r=PASS || r=FAIL
row "truncated .z8 among the games of an evaluation folder" "named with the interpreter's error and left out when loading; every other game played; exit 0" "$got" $r
fi

# --- the table
printf '\n| fault | expected | what happened | result |\n|---|---|---|---|\n'
for r in "${ROWS[@]}"; do IFS='|' read -r a b c d <<<"$r"; printf '| %s | %s | %s | %s |\n' "$a" "$b" "$c" "$d"; done
printf '\nlogs in %s\n' "$WORK"
