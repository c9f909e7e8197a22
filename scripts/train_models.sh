#!/usr/bin/env bash
# Reproduces the bundled models from scratch: corpus + tokenizer, target LM, draft LM.
# Long (hours on 2 cores); every stage resumes from its checkpoint when run again.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/bin/specula
# shellcheck source=scripts/train_env.sh
source scripts/train_env.sh

[ -f data/corpus/manifest.json ] || $BIN prepare-corpus --source /usr/lib/python3.11 --out data/corpus --vocab-size 4096

$BIN train-lm --preset target --data data/corpus --out runs/pyllama-6m --max-position 512 --seq-len 512 \
  --batch-size 8 --steps 1200 --warmup 100 --lr 2e-3 --min-lr 1e-4 --eval-every 100 --checkpoint-every 100 --seed 1
$BIN train-lm --preset draft --data data/corpus --out runs/pyllama-draft-1m --max-position 512 --seq-len 512 \
  --batch-size 8 --steps 1200 --warmup 50 --lr 3e-3 --min-lr 1e-4 --eval-every 100 --checkpoint-every 100 --seed 2 \
  --depth-scaled-init=false  # the committed draft LM predates depth-scaled init; this reproduces it

for m in pyllama-6m pyllama-draft-1m; do
  mkdir -p models/$m
  cp runs/$m/{config.json,model.safetensors,tokenizer.json,training.json} models/$m/
done
