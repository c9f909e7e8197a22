#!/usr/bin/env bash
# Beagle's training ablations (issue 17), each setting trained with the same recipe and step
# budget on the same data, then measured on held-out prompts in one `specula bench` run:
#   - hidden-state regression weight: vloss 0.1 vs the paper's 10 (window 5, 4 simulation steps);
#   - the paper's Figure 4: early-stage window k = 1..5 (simulation steps min(4, k));
#   - the paper's Figure 10: late-stage simulation steps s = 1..5 at window 5.
# Every training resumes from its checkpoint when run again; finished ones are skipped.
#   scripts/sweep_beagle.sh [OUT]     (default docs/sweep-beagle)
# Environment: STEPS (200), VLOSS (10: the window and simulation runs), DATA (data/distill.bin),
# RUNS (runs/sweep-beagle), SKIP_TRAIN (0), BENCH_ARGS (extra `specula bench` flags).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-docs/sweep-beagle}"
BIN=build/bin/specula
MODEL=models/pyllama-6m
DATA="${DATA:-data/distill.bin}"
RUNS="${RUNS:-runs/sweep-beagle}"
STEPS="${STEPS:-200}"
VLOSS="${VLOSS:-10}"
# shellcheck source=scripts/train_env.sh
source scripts/train_env.sh
require_distill "$DATA"

# The recipe's Beagle flags (scripts/train_drafters.sh) with STEPS steps.
RECIPE=(--kind beagle --model "$MODEL" --data "$DATA" --steps "$STEPS" --batch-size 8 --lr 1.5e-3
  --min-lr 5e-5 --warmup-fraction 0.05 --max-seq-len 384 --val-records 64
  --eval-every "$STEPS" --checkpoint-every 25 --log-every 10 --seed 1)

# name window sim vloss
SETTINGS=(
  "vloss0.1 5 4 0.1"
  "w5-s4 5 4 $VLOSS"
  "w1-s1 1 1 $VLOSS" "w2-s2 2 2 $VLOSS" "w3-s3 3 3 $VLOSS" "w4-s4 4 4 $VLOSS"
  "w5-s1 5 1 $VLOSS" "w5-s2 5 2 $VLOSS" "w5-s3 5 3 $VLOSS" "w5-s5 5 5 $VLOSS"
)

train() {  # NAME FLAGS...
  local name="$1"
  shift
  if [ -f "$RUNS/$name/training.json" ] && [ -f "$RUNS/$name/model.safetensors" ] &&
    grep -q "\"steps\": $STEPS," "$RUNS/$name/training.json"; then
    echo "== $name: trained"
    return
  fi
  echo "== training $name"
  "$BIN" train-drafter "${RECIPE[@]}" --out "$RUNS/$name" "$@"
}

if [ "${SKIP_TRAIN:-0}" != 1 ]; then
  for s in "${SETTINGS[@]}"; do
    read -r name window sim vloss <<<"$s"
    train "$name" --window "$window" --sim-steps "$sim" --vloss-weight "$vloss"
  done
fi

# Acceptance on held-out prompts (greedy: exact, independent of load), batch 1: the argmax chain
# at 4 tokens and the EAGLE-2 dynamic tree at 8 and 60 nodes.
mkdir -p "$(dirname "$OUT")"
read -r -a EXTRA <<<"${BENCH_ARGS:-}"
for s in "${SETTINGS[@]}"; do
  read -r name _ <<<"$s"
  echo "== bench $name"
  "$BIN" bench --model "$MODEL" --drafter beagle-chain,beagle --beagle-model "$RUNS/$name" \
    --batch-sizes 1 --draft-lens 4,8,60 --max-new-tokens 64 --repeats 1 --min-requests 16 \
    "${EXTRA[@]}" --json "$OUT-$name.json"
done
