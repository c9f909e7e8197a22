#!/usr/bin/env bash
# Why SpecFormer trails the EAGLE-style drafters (issue 17): each setting trained with the same
# recipe and step budget on the same data, then measured on held-out prompts in one
# `specula bench` run. One change from the bundled recipe (scripts/train_drafters.sh) per run:
#   paper        the paper's network (hooks {0, L/2, L-1, L}, l_d = 8, bidirectional slots)
#   pending      + the pending token's embedding (what Beagle and ParallelSpec read, and it lacks)
#   ld4          l_d = 4 slots instead of 8 (slot count)
#   causal       causal slot attention (the reference code) instead of bidirectional
#   top-hook     the context attention reads only the target's top state (1 hook instead of 4)
#   paper-opt    the paper's Appendix A optimiser: lr 5e-4 -> 1e-5, AdamW eps 2e-4
#   all-pos      every response position's slots trained each step (not a random quarter)
#   pending-ld4  the pending token with l_d = 4 slots (not in the default NAMES)
# Every training resumes from its checkpoint when run again; finished ones are skipped.
#   scripts/sweep_specformer.sh [OUT]     (default docs/sweep-specformer)
# Environment: STEPS (250), NAMES (all of the above), DATA (data/distill.bin),
# RUNS (runs/sweep-specformer), SKIP_TRAIN (0), BENCH_ARGS (extra `specula bench` flags).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-docs/sweep-specformer}"
BIN=build/bin/specula
MODEL=models/pyllama-6m
DATA="${DATA:-data/distill.bin}"
RUNS="${RUNS:-runs/sweep-specformer}"
STEPS="${STEPS:-250}"
NAMES="${NAMES:-paper,pending,ld4,causal,top-hook,paper-opt,all-pos}"
# shellcheck source=scripts/train_env.sh
source scripts/train_env.sh
require_distill "$DATA"

RECIPE=(--kind specformer --model "$MODEL" --data "$DATA" --steps "$STEPS" --batch-size 8
  --max-seq-len 384 --val-records 64 --eval-every "$STEPS" --checkpoint-every 25 --log-every 10
  --seed 1)
setting() {
  local lr=(--lr 1.5e-3 --min-lr 5e-5) pf=(--position-fraction 0.25)
  case "$1" in
    paper) echo "${lr[*]} ${pf[*]}" ;;
    pending) echo "${lr[*]} ${pf[*]} --pending-token" ;;
    ld4) echo "${lr[*]} ${pf[*]} --draft-len 4" ;;
    causal) echo "${lr[*]} ${pf[*]} --causal-draft" ;;
    top-hook) echo "${lr[*]} ${pf[*]} --hidden-layers 6" ;;
    paper-opt) echo "--lr 5e-4 --min-lr 1e-5 --adam-eps 2e-4 ${pf[*]}" ;;
    all-pos) echo "${lr[*]} --position-fraction 1" ;;
    pending-ld4) echo "${lr[*]} ${pf[*]} --pending-token --draft-len 4" ;;
    *) echo "unknown setting '$1'" >&2; return 1 ;;
  esac
}

if [ "${SKIP_TRAIN:-0}" != 1 ]; then
  for name in ${NAMES//,/ }; do
    read -r -a flags <<<"$(setting "$name")"
    if [ -f "$RUNS/$name/training.json" ] && grep -q "\"steps\": $STEPS," "$RUNS/$name/training.json"; then
      echo "== $name: trained"
      continue
    fi
    echo "== training $name"
    "$BIN" train-drafter "${RECIPE[@]}" "${flags[@]}" --out "$RUNS/$name"
  done
fi

# Acceptance on held-out prompts (greedy: exact, independent of load), batch 1: the budgeted tree
# (the default) and the argmax chain at 4 and 8 tokens per step.
mkdir -p "$(dirname "$OUT")"
read -r -a EXTRA <<<"${BENCH_ARGS:-}"
for name in ${NAMES//,/ }; do
  echo "== bench $name"
  for tree in true false; do
    "$BIN" bench --model "$MODEL" --drafter specformer --specformer-model "$RUNS/$name" \
      --specformer-tree="$tree" --batch-sizes 1 --draft-lens 4,8 --max-new-tokens 64 --repeats 1 \
      --min-requests 16 "${EXTRA[@]}" --json "$OUT-$name-$([ "$tree" = true ] && echo tree || echo chain).json"
  done
done
