#!/usr/bin/env bash
# ParallelSpec's two training ablations (issue 15), each setting trained with the same recipe and
# step budget on the same data, then measured on held-out prompts in one `specula bench` run:
#   - group size k = KS (default 1..6): --num-masks k, self-distilled data;
#   - self-distilled vs raw corpus at k = 4: --raw-tokens data/corpus/train.tok (continuations of
#     the corpus instead of the target's own greedy responses).
# Every training resumes from its checkpoint when run again; finished ones are skipped.
#   scripts/sweep_parallelspec.sh [OUT]     (default docs/sweep-parallelspec)
# Environment: KS (1,2,3,4,5,6), STEPS (150), DATA (data/distill.bin), RUNS (runs/sweep-parallelspec),
# SKIP_TRAIN (0), BENCH_ARGS (extra `specula bench` flags).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-docs/sweep-parallelspec}"
BIN=build/bin/specula
MODEL=models/pyllama-6m
DATA="${DATA:-data/distill.bin}"
RUNS="${RUNS:-runs/sweep-parallelspec}"
STEPS="${STEPS:-150}"
KS="${KS:-1,2,3,4,5,6}"
# shellcheck source=scripts/train_env.sh
source scripts/train_env.sh
require_distill "$DATA"

# The recipe of the bundled drafter (models/README.md), with STEPS steps.
RECIPE=(--kind parallelspec --model "$MODEL" --data "$DATA" --steps "$STEPS" --batch-size 8 --lr 1.5e-3
  --min-lr 5e-5 --warmup-fraction 0.05 --max-seq-len 256 --val-records 64 --group-fraction 0.25
  --eval-every "$STEPS" --checkpoint-every 25 --log-every 10 --seed 1)

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
  for k in ${KS//,/ }; do train "k$k" --num-masks "$k"; done
  train raw-k4 --num-masks 4 --raw-tokens data/corpus/train.tok --raw-records 16000
fi

# Acceptance on held-out prompts (greedy: exact, independent of load) and speed, batch 1: each
# drafter's own chain (k + 1 tokens from one forward) and the marginal tree at 8 nodes.
mkdir -p "$(dirname "$OUT")"
read -r -a EXTRA <<<"${BENCH_ARGS:-}"
for name in $(for k in ${KS//,/ }; do echo "k$k"; done) raw-k4; do
  k="${name##*k}"
  echo "== bench $name"
  "$BIN" bench --model "$MODEL" --drafter parallelspec-chain,parallelspec \
    --parallelspec-model "$RUNS/$name" --batch-sizes 1 --draft-lens "$((k + 1)),8" \
    --max-new-tokens 64 --repeats 1 --min-requests 16 "${EXTRA[@]}" --json "$OUT-$name.json"
done
