#!/usr/bin/env bash
# The drafter leaderboard (issue 17): every drafter at fixed budgets and with the adaptive budget,
# batch 1/4/16/64, greedy and temperature 1, interleaved with no speculation in the same process
# (`specula bench` on held-out prompts), then one table (scripts/leaderboard.py): per row the best
# fixed budget and the adaptive one with speedup, a, theta and draft-time share, the drafter's
# memory and its training cost.
#   scripts/leaderboard.sh [OUT]     (default docs/leaderboard: OUT-t0.json, OUT-t1.json, OUT.json,
#                                     OUT.md)
# Environment: DRAFTERS (ngram,draft-model,specformer,beagle,parallelspec,specdec),
# BATCHES (1,4,16,64), LENS (2,4,8,16,adaptive), REPEATS (2), MIN_REQUESTS (8), MAX_NEW (64),
# TEMPS ("0 1": the temperatures to run; the table reads both files), BENCH_ARGS (extra
# `specula bench` flags). Run it on a quiet machine: speedups are timings.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-docs/leaderboard}"
BIN=build/bin/specula
DRAFTERS="${DRAFTERS:-ngram,draft-model,specformer,beagle,parallelspec,specdec}"
read -r -a EXTRA <<<"${BENCH_ARGS:-}"
mkdir -p "$(dirname "$OUT")"
for t in ${TEMPS:-0 1}; do
  echo "== temperature $t" >&2
  "$BIN" bench --model models/pyllama-6m --drafter "$DRAFTERS" \
    --drafter-model models/pyllama-draft-1m --specformer-model models/specformer-pyllama-6m \
    --beagle-model models/beagle-pyllama-6m --parallelspec-model models/parallelspec-pyllama-6m \
    --specdec-model models/specdec-pyllama-6m --batch-sizes "${BATCHES:-1,4,16,64}" \
    --draft-lens "${LENS:-2,4,8,16,adaptive}" --temperature "$t" --max-new-tokens "${MAX_NEW:-64}" \
    --repeats "${REPEATS:-2}" --min-requests "${MIN_REQUESTS:-8}" "${EXTRA[@]}" --json "$OUT-t$t.json"
done
scripts/leaderboard.py "$OUT-t0.json" "$OUT-t1.json" --json "$OUT.json" | tee "$OUT.md"
