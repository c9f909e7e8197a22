#!/usr/bin/env bash
# Beagle's training ablations (issue 17), each setting trained with the same recipe and step
# budget on the same data, then measured on held-out prompts in one `specula bench` run:
#   vloss0.1, w5-s4   hidden-state regression weight 0.1 vs the paper's 10 (window 5, 4 simulation
#                     steps, both stages)
#   early-w1..w5      the paper's Figure 4: the early-stage window k = 1..5, early stage only (the
#                     late stage's simulation steps are capped by the window)
#   w5-s1..s3         the paper's Figure 10: late-stage simulation steps s at window 5 (w5-s4 is
#                     the fourth point)
# Every training resumes from its checkpoint when run again; finished ones are skipped.
#   scripts/sweep_beagle.sh [OUT]     (default docs/sweep-beagle)
# Environment: STEPS (200), NAMES (all of the above), VLOSS (10: every run but vloss0.1),
# DATA (data/distill.bin), RUNS (runs/sweep-beagle), SKIP_TRAIN (0), SKIP_BENCH (0),
# BENCH_ARGS (extra `specula bench` flags).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-docs/sweep-beagle}"
BIN=build/bin/specula
MODEL=models/pyllama-6m
DATA="${DATA:-data/distill.bin}"
RUNS="${RUNS:-runs/sweep-beagle}"
STEPS="${STEPS:-200}"
VLOSS="${VLOSS:-10}"
NAMES="${NAMES:-vloss0.1,w5-s4,early-w1,early-w2,early-w3,early-w4,early-w5,w5-s1,w5-s2,w5-s3}"
# shellcheck source=scripts/train_env.sh
source scripts/train_env.sh
require_distill "$DATA"

# The recipe's Beagle flags (scripts/train_drafters.sh) with STEPS steps.
RECIPE=(--kind beagle --model "$MODEL" --data "$DATA" --steps "$STEPS" --batch-size 8 --lr 1.5e-3
  --min-lr 5e-5 --warmup-fraction 0.05 --max-seq-len 384 --val-records 64
  --eval-every "$STEPS" --checkpoint-every 25 --log-every 10 --seed 1)
setting() {
  case "$1" in
    vloss0.1) echo "--window 5 --sim-steps 4 --vloss-weight 0.1" ;;
    w5-s[1-5]) echo "--window 5 --sim-steps ${1#w5-s} --vloss-weight $VLOSS" ;;
    early-w[1-5])
      local w="${1#early-w}"
      echo "--window $w --sim-steps $((w < 4 ? w : 4)) --early-fraction 1 --vloss-weight $VLOSS"
      ;;
    *) echo "unknown setting '$1'" >&2; return 1 ;;
  esac
}

if [ "${SKIP_TRAIN:-0}" != 1 ]; then
  for name in ${NAMES//,/ }; do
    read -r -a flags <<<"$(setting "$name")"
    if [ -f "$RUNS/$name/training.json" ] && [ -f "$RUNS/$name/model.safetensors" ] &&
      grep -q "\"steps\": $STEPS," "$RUNS/$name/training.json"; then
      echo "== $name: trained"
      continue
    fi
    echo "== training $name"
    "$BIN" train-drafter "${RECIPE[@]}" "${flags[@]}" --out "$RUNS/$name"
  done
fi
[ "${SKIP_BENCH:-0}" = 1 ] && exit 0

# Acceptance on held-out prompts (greedy: exact, independent of load), batch 1: the argmax chain
# and the EAGLE-2 dynamic tree at 4, 8 and 60 tokens per step.
mkdir -p "$(dirname "$OUT")"
read -r -a EXTRA <<<"${BENCH_ARGS:-}"
for name in ${NAMES//,/ }; do
  echo "== bench $name"
  "$BIN" bench --model "$MODEL" --drafter beagle-chain,beagle --beagle-model "$RUNS/$name" \
    --batch-sizes 1 --draft-lens 4,8,60 --max-new-tokens 64 --repeats 1 --min-requests 16 \
    "${EXTRA[@]}" --json "$OUT-$name.json"
done
