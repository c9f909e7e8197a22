#!/usr/bin/env bash
# The one training recipe for every learned drafter of the bundled target (issue 17): the same
# self-distillation data (data/distill.bin, `specula distill`), the same held-out validation
# records (the file's last 64), and the same wall-clock budget per drafter on this machine.
#
#   scripts/train_drafters.sh [KINDS]     (default specformer,beagle,parallelspec,specdec,draft-model)
#
# draft-model is the standalone draft LM (models/pyllama-draft-1m, trained on the corpus) fine-tuned
# on the same set with `specula train-lm --init-from --distill-data`.
#
# A budget in minutes is turned into a step count per drafter: a short probe run measures the
# drafter's seconds per step, and the real run gets BUDGET_MIN * 60 / that many steps (its cosine
# schedule needs the count up front). Every run checkpoints and resumes when the script is run
# again; finished runs are skipped. Results land in RUNS/<kind> (config.json, model.safetensors,
# training.json with the command and the validation figures); copying them to models/ is a
# separate, deliberate step (models/README.md).
# Environment: BUDGET_MIN (20), DATA (data/distill.bin), RUNS (runs/recipe), SEED (1), EXTRA (more
# train-drafter flags for every kind: a variant's shape, e.g. "--num-slots 16", with its own RUNS).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin/specula
MODEL=models/pyllama-6m
KINDS="${1:-specformer,beagle,parallelspec,specdec,draft-model}"
DATA="${DATA:-data/distill.bin}"
RUNS="${RUNS:-runs/recipe}"
BUDGET_MIN="${BUDGET_MIN:-20}"
# shellcheck source=scripts/train_env.sh
source scripts/train_env.sh
require_distill "$DATA"

COMMON=(--model "$MODEL" --data "$DATA" --batch-size 8 --val-records 64 --log-every 10
  --seed "${SEED:-1}")
# Each kind's own settings (models/README.md has the measurements behind them): Beagle with the
# paper's vloss weight 10 (scripts/sweep_beagle.sh: held-out a 2.08 vs 1.91 for 0.1, chain of 4);
# SpecFormer with the pending token (+0.09 top-1 on slot 0, scripts/sweep_specformer.sh) and causal
# slots (the same accuracy as bidirectional, and serving then runs only the slots a step drafts).
flags() {
  case "$1" in
    specformer) echo "--kind specformer --lr 1.5e-3 --min-lr 5e-5 --position-fraction 0.25 --max-seq-len 384 --pending-token --causal-draft" ;;
    beagle) echo "--kind beagle --lr 1.5e-3 --min-lr 5e-5 --warmup-fraction 0.05 --max-seq-len 384 --vloss-weight 10" ;;
    parallelspec) echo "--kind parallelspec --lr 1.5e-3 --min-lr 5e-5 --warmup-fraction 0.05 --max-seq-len 256 --group-fraction 0.25" ;;
    specdec) echo "--kind specdec --lr 2e-3 --warmup-fraction 0.075 --max-seq-len 384" ;;
    # Fine-tuning a trained LM: a tenth of its pretraining peak lr scale, short warmup, its window.
    draft-model) echo "--init-from models/pyllama-draft-1m --lr 1e-3 --min-lr 1e-4 --warmup 20 --seq-len 512" ;;
    *) echo "unknown drafter kind '$1' (specformer, beagle, parallelspec, specdec, draft-model)" >&2; return 1 ;;
  esac
}
# train KIND OWN_FLAGS... -- RUN_FLAGS...: the trainer of the kind with the recipe's data.
train() {
  local kind="$1"
  shift
  if [ "$kind" = draft-model ]; then
    "$BIN" train-lm --distill-data "$DATA" --val-records 64 --batch-size 8 --log-every 10 \
      --seed "${SEED:-1}" "$@"
  else
    "$BIN" train-drafter "${COMMON[@]}" "$@"
  fi
}

for kind in ${KINDS//,/ }; do
  read -r -a own <<<"$(flags "$kind") ${EXTRA:-}"
  out="$RUNS/$kind"
  if [ -f "$out/steps" ]; then
    steps="$(cat "$out/steps")"
  else
    # The probe: two resumed runs of 5 and 25 steps after 2 unmeasured ones (allocation, first
    # touches); their difference is 20 steps without the start-up (loading the target and data).
    # Beagle's two stages cost differently (the late stage simulates 4 drafting steps): each is
    # probed and the step time is their mean (the schedule splits the steps in half).
    probe_step() {  # EXTRA FLAGS... -> seconds per step
      local probe="$RUNS/probe-$kind"
      rm -rf "$probe"
      run() {
        train "$kind" "${own[@]}" "${@:2}" --out "$probe" --steps 100000 \
          --max-steps-this-run "$1" --eval-every 1000000 --checkpoint-every "$1" >/dev/null
      }
      run 2 "$@"
      local t0 t1 t2
      t0=$(date +%s.%N)
      run 5 "$@"
      t1=$(date +%s.%N)
      run 25 "$@"
      t2=$(date +%s.%N)
      rm -rf "$probe"
      awk -v a="$t0" -v b="$t1" -v c="$t2" 'BEGIN { printf "%.4f\n", ((c - b) - (b - a)) / 20 }'
    }
    if [ "$kind" = beagle ]; then
      early="$(probe_step --early-fraction 1)"
      late="$(probe_step --early-fraction 0)"
      per_step="$(awk -v e="$early" -v l="$late" 'BEGIN { printf "%.4f", (e + l) / 2 }')"
      echo "beagle: early stage $early s per step, late stage $late s per step"
    else
      per_step="$(probe_step)"
    fi
    steps="$(awk -v p="$per_step" -v m="$BUDGET_MIN" 'BEGIN { printf "%d", m * 60 / p }')"
    mkdir -p "$out"
    echo "$steps" >"$out/steps"
    printf '%s: %.2f s per step -> %d steps in %d min\n' "$kind" "$per_step" "$steps" "$BUDGET_MIN"
  fi
  if [ -f "$out/training.json" ] && grep -q "\"steps\": $steps," "$out/training.json"; then
    echo "== $kind: trained ($steps steps)"
    continue
  fi
  echo "== training $kind: $steps steps"
  train "$kind" "${own[@]}" --out "$out" --steps "$steps" \
    --eval-every "$((steps / 4 > 0 ? steps / 4 : 1))" --checkpoint-every 25
done
