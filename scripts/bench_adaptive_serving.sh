#!/usr/bin/env bash
# The adaptive draft budget served: two `specula serve` processes side by side, one with
# `--draft-budget adaptive` (the default) and one with `--draft-budget fixed --draft-len K`, measured
# by specula-loadgen in the same run on the same held-out prompts, for every drafter and without
# speculation, at several concurrencies. With SPLIT=1 each is three processes (drafter, target,
# router over loopback gRPC) instead of one.
#
#   scripts/bench_adaptive_serving.sh [OUT]     (default docs/bench-adaptive-serving-pyllama-6m-cpu)
# Environment: CONCURRENCY (1,4,16,64),
# DRAFTERS (none,ngram,draft-model,specformer,parallelspec,beagle),
# MAX_NEW_TOKENS (48), REPEATS (3), FIXED_LEN (4; 0 = the adaptive stack alone, at `specula
# serve`'s defaults, so that no second stack shares the machine; with AA=1 loadgen also measures
# it as a second target "control", an A/A run whose ratios show the machine's spread),
# REQUEST_RATE (0 = all at once), RANGE_RATIO (0: every request MAX_NEW_TOKENS long; R: output
# lengths uniform in MAX_NEW_TOKENS x [1 - R, 1 + R], loadgen's --random-range-ratio), SPLIT (0),
# NUM_PROMPTS (requests per run; 0 = 2 x concurrency, at least 8), NUM_WARMUPS (0),
# PERCENTILE_METRICS (ttft,tpot,itl,token_itl: p99 of ITL per streamed chunk and per token).
# OLD_BIN=DIR compares builds instead of budgets: targets "old" (DIR/specula) and "new"
# (build/bin/specula), both with BUDGET (default "adaptive"; e.g. BUDGET="fixed --draft-len 4"),
# the new one also with NEW_FLAGS; NAMES (old,new) renames the two. With OLD_BIN=build/bin and
# NEW_FLAGS this compares settings of one build, e.g. NEW_FLAGS="--max-draft-slowdown 0.05".
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-docs/bench-adaptive-serving-pyllama-6m-cpu}"
MODEL=models/pyllama-6m
BIN=build/bin
LOGS="$(mktemp -d)"
trap 'for p in "$LOGS"/*.pid; do [ -f "$p" ] && { kill "$(cat "$p")" 2>/dev/null || true; }; done; rm -rf "$LOGS"' EXIT

# shellcheck source=scripts/serve_lib.sh
source scripts/serve_lib.sh

DRAFTER_FLAGS=(--drafter ngram,draft-model,specformer,parallelspec,beagle
  --drafter-model models/pyllama-draft-1m --specformer-model models/specformer-pyllama-6m
  --parallelspec-model models/parallelspec-pyllama-6m --beagle-model models/beagle-pyllama-6m
  --draft-vocab "$MODEL/draft_vocab.json")

# start NAME BUDGET_FLAGS...: one server (or three processes) named NAME; prints its public port.
start() {
  local name="$1"
  shift
  if [ "${SPLIT:-0}" = 1 ]; then
    local dport tport rport
    read -r dport _ < <(serve "$name-drafter" --role drafter --model "$MODEL" "${DRAFTER_FLAGS[@]}" \
      --port 0 --metrics-port 0)
    local tmetrics
    read -r tport tmetrics < <(serve "$name-target" --role target --model "$MODEL" \
      --drafter-address "127.0.0.1:$dport" --port 0 --metrics-port -1)
    echo "$tmetrics" >"$LOGS/$name.target-metrics-port"
    read -r rport _ < <(serve "$name-router" --role router --model "$MODEL" \
      --target-address "127.0.0.1:$tport" --port 0 --metrics-port 0 --default-drafter none "$@")
    echo "$rport"
  else
    local port
    read -r port _ < <(serve "$name" --model "$MODEL" "${DRAFTER_FLAGS[@]}" --port 0 \
      --metrics-port 0 --default-drafter none "$@")
    echo "$port"
  fi
}
if [ -n "${OLD_BIN:-}" ]; then
  read -r -a BUDGET_FLAGS <<<"--draft-budget ${BUDGET:-adaptive}"
  read -r -a NEW_EXTRA <<<"${NEW_FLAGS:-}"
  IFS=, read -r OLD_NAME NEW_NAME <<<"${NAMES:-old,new}"
  OLD_PORT="$(BIN="$OLD_BIN" start "$OLD_NAME" "${BUDGET_FLAGS[@]}")"
  NEW_PORT="$(start "$NEW_NAME" "${BUDGET_FLAGS[@]}" "${NEW_EXTRA[@]}")"
  echo "$OLD_NAME ($OLD_BIN) on :$OLD_PORT, $NEW_NAME (build/bin ${NEW_EXTRA[*]}) on :$NEW_PORT," \
    "${BUDGET_FLAGS[*]} (split=${SPLIT:-0})"
  TARGETS="$OLD_NAME=127.0.0.1:$OLD_PORT,$NEW_NAME=127.0.0.1:$NEW_PORT"
elif [ "${FIXED_LEN:-4}" = 0 ]; then
  ADAPTIVE_PORT="$(start adaptive --draft-budget adaptive)"
  echo "adaptive on :$ADAPTIVE_PORT, alone (split=${SPLIT:-0})"
  TARGETS="adaptive=127.0.0.1:$ADAPTIVE_PORT"
  [ "${AA:-0}" = 1 ] && TARGETS="$TARGETS,control=127.0.0.1:$ADAPTIVE_PORT"
else
  ADAPTIVE_PORT="$(start adaptive --draft-budget adaptive)"
  FIXED_PORT="$(start fixed --draft-budget fixed --draft-len "${FIXED_LEN:-4}")"
  echo "adaptive on :$ADAPTIVE_PORT, fixed k=${FIXED_LEN:-4} on :$FIXED_PORT (split=${SPLIT:-0})"
  TARGETS="adaptive=127.0.0.1:$ADAPTIVE_PORT,fixed=127.0.0.1:$FIXED_PORT"
fi

"$BIN/specula-loadgen" --model "$MODEL" \
  --targets "$TARGETS" \
  --drafters "${DRAFTERS:-none,ngram,draft-model,specformer,parallelspec,beagle}" \
  --concurrency "${CONCURRENCY:-1,4,16,64}" --max-new-tokens "${MAX_NEW_TOKENS:-48}" \
  --request-rate "${REQUEST_RATE:-0}" --random-range-ratio "${RANGE_RATIO:-0}" \
  --num-prompts "${NUM_PROMPTS:-0}" \
  --num-warmups "${NUM_WARMUPS:-0}" --ignore-eos --repeats "${REPEATS:-3}" \
  --percentile-metrics "${PERCENTILE_METRICS:-ttft,tpot,itl,token_itl}" --json "$OUT.json"

# Three processes: each target's own step and drafter-call totals over the whole run (the drafter
# round trips are inside its draft seconds), in OUT-targets.txt.
if [ "${SPLIT:-0}" = 1 ]; then
  for f in "$LOGS"/*.target-metrics-port; do
    name="$(basename "$f" .target-metrics-port)"
    curl -s "http://127.0.0.1:$(cat "$f")/metrics" |
      grep -E '^specula_target_(steps_total|draft_seconds_total|step_duration_seconds_(sum|count))' |
      sed "s/^/$name /"
  done | tee "$OUT-targets.txt"
fi
