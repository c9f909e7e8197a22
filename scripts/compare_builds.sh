#!/usr/bin/env bash
# Old build vs new build, interleaved in one run on the same machine: forward cost curve
# (bench-forward), plain and speculative decoding (bench), and greedy outputs on held-out prompts
# token for token. Usage:
#   scripts/compare_builds.sh OLD_SPECULA NEW_SPECULA OUT_DIR
# e.g. build the previous commit with -DSPECULA_WITH_GRPC=OFF into /tmp/old and run
#   scripts/compare_builds.sh /tmp/old/build/bin/specula build/bin/specula docs/compare
# Environment: REPEATS (5), PROMPTS (24), MAX_NEW_TOKENS (64), DRAFTERS (ngram,specformer,beagle),
# SECTIONS (forward,bench,greedy).
set -euo pipefail
cd "$(dirname "$0")/.."
OLD="$1" NEW="$2" OUT="$3"
REPEATS="${REPEATS:-5}" PROMPTS="${PROMPTS:-24}" MAX_NEW="${MAX_NEW_TOKENS:-64}"
DRAFTERS="${DRAFTERS:-ngram,specformer,beagle}"
SECTIONS="${SECTIONS:-forward,bench,greedy}"
MODEL=models/pyllama-6m
mkdir -p "$OUT"
SPEC=(--specformer-model models/specformer-pyllama-6m --beagle-model models/beagle-pyllama-6m)

if [[ ",$SECTIONS," == *,forward,* ]]; then
echo "== bench-forward (old, new) =="
for build in old new; do
  bin="$OLD"; [ "$build" = new ] && bin="$NEW"
  "$bin" bench-forward --model "$MODEL" --batch-sizes 1,4,16,64 --tokens-per-seq 1,2,4,5,8,16 \
    --contexts 8,128,384 --max-tokens 1024 --repeats "$REPEATS" --json "$OUT/bench-forward-$build.json" \
    | sed "s/^/$build /"
done
fi

if [[ ",$SECTIONS," == *,bench,* ]]; then
echo "== bench, plain and speculative (old, new, old, new) =="
for rep in 1 2; do
  for build in old new; do
    bin="$OLD"; [ "$build" = new ] && bin="$NEW"
    "$bin" bench --model "$MODEL" --drafter "$DRAFTERS" "${SPEC[@]}" --batch-sizes 1,4,16,64 \
      --draft-lens 2,4 --max-new-tokens "$MAX_NEW" --repeats 1 --min-requests 16 \
      --json "$OUT/bench-$build-$rep.json" 2>/dev/null | sed "s/^/$build /"
  done
done
fi

[[ ",$SECTIONS," == *,greedy,* ]] || exit 0
echo "== greedy outputs on held-out prompts (old vs new) =="
mismatches=0
i=0
# Held-out sources (the Python 3.11 test/ tree is never trained on), the first 400 bytes of each.
for file in $(find /usr/lib/python3.11/test -name '*.py' -size +1k | sort | head -n "$PROMPTS"); do
  prompt="$(head -c 400 "$file")"
  a=$("$OLD" generate --model "$MODEL" --prompt "$prompt" --max-new-tokens "$MAX_NEW" --json |
      /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["token_ids"])')
  b=$("$NEW" generate --model "$MODEL" --prompt "$prompt" --max-new-tokens "$MAX_NEW" --json |
      /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["token_ids"])')
  if [ "$a" != "$b" ]; then
    mismatches=$((mismatches + 1))
    echo "DIFFERENT: $file"
    echo "  old $a"
    echo "  new $b"
  fi
  i=$((i + 1))
done
echo "greedy outputs: $i prompts, $mismatches differ" | tee "$OUT/greedy-compare.txt"
