#!/usr/bin/env bash
# Served inter-token latency with long prompts arriving among running decodes: the bundled model
# served twice, with the default step token budget (chunked prefill) and with a budget larger than
# any prompt (each prompt prefilled in one step), measured by specula-loadgen in one interleaved run.
#
#   scripts/bench_chunked_prefill.sh [OUT_JSON]     (default docs/bench-chunked-prefill.json)
# Environment: PROMPT_TOKENS (448), MAX_NEW_TOKENS (48), CONCURRENCY (16), RATE (4 requests/s),
# NUM_PROMPTS (64), REPEATS (2), BUDGET (256).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-docs/bench-chunked-prefill.json}"
MODEL=models/pyllama-6m
LOGS="$(mktemp -d)"
trap 'for p in "$LOGS"/*.pid; do [ -f "$p" ] && { kill "$(cat "$p")" 2>/dev/null || true; }; done; rm -rf "$LOGS"' EXIT

BIN=build/bin
# shellcheck source=scripts/serve_lib.sh
source scripts/serve_lib.sh

read -r CHUNKED _ < <(serve chunked --model "$MODEL" --port 0 --metrics-port 0 --default-drafter none \
  --max-step-tokens "${BUDGET:-256}")
read -r WHOLE _ < <(serve whole --model "$MODEL" --port 0 --metrics-port 0 --default-drafter none \
  --max-step-tokens 100000)
build/bin/specula-loadgen --model "$MODEL" \
  --targets "chunked=127.0.0.1:$CHUNKED,whole=127.0.0.1:$WHOLE" --drafters none \
  --prompt-tokens "${PROMPT_TOKENS:-448}" --max-new-tokens "${MAX_NEW_TOKENS:-48}" \
  --concurrency "${CONCURRENCY:-16}" --request-rate "${RATE:-4}" \
  --num-prompts "${NUM_PROMPTS:-64}" --repeats "${REPEATS:-2}" --ignore-eos --json "$OUT"
