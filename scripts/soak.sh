#!/usr/bin/env bash
# Soak test (issue 19): `specula serve` with the bundled model and every drafter, all-in-one
# (MODE=all-in-one) or as three processes (MODE=split: drafter, target, router over loopback gRPC),
# driven by specula-loadgen with REQUESTS requests that mix greedy and sampled decoding (seeds,
# top-p, top-k), every drafter, stop strings, client cancels after a random delay, short deadlines
# (some expire in the queue), prompts that fill the context exactly, and a few invalid requests.
# In split mode the drafter is killed (SIGKILL) in the middle chunk and restarted on its port.
#
# Checks (scripts/soak.py analyze): no request lost (every one answered: a completion or a status,
# never a client-side timeout or a dropped connection), every greedy completion equal to the
# `drafter: none` reference of the same request, no error the request did not ask for, no server
# death, no request/KV/drafter state left once idle, and every server's RSS within RSS_LIMIT_PCT
# of its value at the end of the warm-up (the first WARMUP_CHUNKS chunks). Exit 1 otherwise.
#
#   scripts/soak.sh [OUT_DIR]      (default: a new temporary directory, printed)
# Environment: MODE (all-in-one), REQUESTS (10000), CHUNKS (10), CONCURRENCY (16),
# MAX_BATCH_SIZE (8: fewer than CONCURRENCY, so requests wait in the queue), SEED (1), PROMPTS (12),
# DRAFTERS (none,ngram,draft-model,specformer,beagle,beagle-chain), WARMUP_CHUNKS (2),
# RSS_INTERVAL_S (2), RSS_LIMIT_PCT (5), RESTART_DRAFTER (1 in split mode), RESTART_AFTER_S (5),
# RESTART_DOWN_S (3), IDLE_S (3: the wait before the idle check), REF_CONCURRENCY (4: the
# references' batch), REQUEST_TIMEOUT_S (900: a request unanswered this long is lost), BIN
# (build/bin). Results: OUT_DIR/summary.json (and the table on stdout).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
MODE="${MODE:-all-in-one}"
case "$MODE" in all-in-one | split) ;; *)
  echo "soak.sh: MODE must be all-in-one or split, got '$MODE'" >&2
  exit 2
  ;;
esac
OUT="${1:-$(mktemp -d /tmp/specula-soak.XXXXXX)}"
mkdir -p "$OUT/results"
OUT="$(cd "$OUT" && pwd)"
BIN="${BIN:-$ROOT/build/bin}"
MODEL=models/pyllama-6m
LOGS="$OUT/logs"
mkdir -p "$LOGS"
export MODE REQUESTS="${REQUESTS:-10000}" CHUNKS="${CHUNKS:-10}" SEED="${SEED:-1}"
export PROMPTS="${PROMPTS:-12}" WARMUP_CHUNKS="${WARMUP_CHUNKS:-2}"
export RSS_LIMIT_PCT="${RSS_LIMIT_PCT:-5}"
export DRAFTERS="${DRAFTERS:-none,ngram,draft-model,specformer,beagle,beagle-chain}"
CONCURRENCY="${CONCURRENCY:-16}"
RSS_INTERVAL_S="${RSS_INTERVAL_S:-2}"
RESTART_DRAFTER="${RESTART_DRAFTER:-$([ "$MODE" = split ] && echo 1 || echo 0)}"
SAMPLER=""
cleanup() {
  [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null || true
  for p in "$LOGS"/*.pid; do [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true; done
}
trap cleanup EXIT

# shellcheck source=scripts/serve_lib.sh
source scripts/serve_lib.sh
now() { date +%s.%N; }
event() { echo "$(now) $*" >>"$OUT/events.tsv"; }

DRAFTER_FLAGS=(--drafter ngram,draft-model,specformer,beagle,beagle-chain
  --drafter-model models/pyllama-draft-1m --specformer-model models/specformer-pyllama-6m
  --beagle-model models/beagle-pyllama-6m)
ROUTER_FLAGS=(--default-drafter none --max-batch-size "${MAX_BATCH_SIZE:-8}")
if [ "$MODE" = split ]; then
  read -r DRAFTER_PORT DRAFTER_METRICS < <(serve drafter --role drafter --model "$MODEL" \
    "${DRAFTER_FLAGS[@]}" --port 0 --metrics-port -1)
  read -r TARGET_PORT TARGET_METRICS < <(serve target --role target --model "$MODEL" \
    --drafter-address "127.0.0.1:$DRAFTER_PORT" --port 0 --metrics-port -1)
  read -r PORT ROUTER_METRICS < <(serve router --role router --model "$MODEL" \
    --target-address "127.0.0.1:$TARGET_PORT" --port 0 --metrics-port -1 "${ROUTER_FLAGS[@]}")
  echo "$DRAFTER_METRICS" >"$LOGS/drafter.metrics"
  echo "$TARGET_METRICS" >"$LOGS/target.metrics"
  echo "$ROUTER_METRICS" >"$LOGS/router.metrics"
  echo "soak: router :$PORT -> target :$TARGET_PORT -> drafter :$DRAFTER_PORT"
else
  read -r PORT METRICS < <(serve all --model "$MODEL" "${DRAFTER_FLAGS[@]}" --port 0 \
    --metrics-port -1 "${ROUTER_FLAGS[@]}")
  echo "$METRICS" >"$LOGS/all.metrics"
  echo "soak: all-in-one on :$PORT"
fi
echo "soak: output in $OUT"

# VmRSS of every live server process every RSS_INTERVAL_S: "time role pid kB".
(
  while true; do
    for p in "$LOGS"/*.pid; do
      [ -f "$p" ] || continue
      pid="$(cat "$p")"
      kb="$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)"
      [ -n "$kb" ] && echo "$(now) $(basename "$p" .pid) $pid $kb" >>"$OUT/rss.tsv"
    done
    sleep "$RSS_INTERVAL_S"
  done
) &
SAMPLER=$!

# Every server still running? A dead one is recorded with the end of its stderr.
check_alive() {
  for p in "$LOGS"/*.pid; do
    [ -f "$p" ] || continue
    if ! kill -0 "$(cat "$p")" 2>/dev/null; then
      local name
      name="$(basename "$p" .pid)"
      echo "$name (pid $(cat "$p")) exited: $(tail -c 600 "$LOGS/$name.err" | tr '\n' ' ')" \
        >>"$OUT/crashed.txt"
      mv "$p" "$p.dead"
    fi
  done
}

# loadgen NAME FILE: one specula-loadgen run of a JSONL file; its flat result goes to
# results/NAME.json. Its exit status is 1 when a request failed without asking to (soak.py judges).
loadgen() {
  local name="$1" file="$2" concurrency="$3"
  "$BIN/specula-loadgen" --targets "soak=127.0.0.1:$PORT" --model "$MODEL" \
    --dataset-name jsonl --dataset-path "$file" --num-prompts "$(wc -l <"$file")" \
    --concurrency "$concurrency" --request-timeout-sec "${REQUEST_TIMEOUT_S:-900}" \
    --disable-tqdm --result-dir "$OUT/results" --result-filename "$name.json" \
    >"$LOGS/loadgen-$name.out" 2>&1 || true
  [ -f "$OUT/results/$name.json" ] || echo "soak: loadgen $name wrote no result:" \
    "$(tail -c 400 "$LOGS/loadgen-$name.out")" >&2
}

# Kills the drafter (SIGKILL) RESTART_AFTER_S into the chunk, leaves it down RESTART_DOWN_S (the
# target decodes without speculation), then starts a new one on the same port.
restart_drafter() {
  sleep "${RESTART_AFTER_S:-5}"
  local old
  old="$(cat "$LOGS/drafter.pid")"
  kill -9 "$old"
  mv "$LOGS/drafter.pid" "$LOGS/drafter.pid.killed"
  event "drafter-restart killed $old"
  sleep "${RESTART_DOWN_S:-3}"
  local port metrics
  read -r port metrics < <(serve drafter2 --role drafter --model "$MODEL" "${DRAFTER_FLAGS[@]}" \
    --port "$DRAFTER_PORT" --metrics-port -1)
  echo "$metrics" >"$LOGS/drafter2.metrics"
  event "drafter-started $(cat "$LOGS/drafter2.pid") on :$port"
}

/usr/bin/python3 scripts/soak.py plan "$OUT"
event "references-start"
loadgen refs "$OUT/refs.jsonl" "${REF_CONCURRENCY:-4}"
event "references-end"
check_alive
mapfile -t CHUNK_FILES < <(cd "$OUT" && ls chunk-*.jsonl)
RESTART_CHUNK=$((${#CHUNK_FILES[@]} / 2))
for k in "${!CHUNK_FILES[@]}"; do
  file="${CHUNK_FILES[$k]}"
  RESTARTER=""
  if [ "$MODE" = split ] && [ "$RESTART_DRAFTER" = 1 ] && [ "$k" = "$RESTART_CHUNK" ]; then
    restart_drafter &
    RESTARTER=$!
  fi
  event "chunk-start $k"
  loadgen "${file%.jsonl}" "$OUT/$file" "$CONCURRENCY"
  event "chunk-end $k"
  [ -n "$RESTARTER" ] && { wait "$RESTARTER" || echo "soak: the drafter restart failed" >&2; }
  check_alive
  echo "soak: chunk $((k + 1))/${#CHUNK_FILES[@]} done"
done
# Idle: every request's state must be gone (requests, KV blocks, drafter sequences).
sleep "${IDLE_S:-3}"
for m in "$LOGS"/*.metrics; do
  name="$(basename "$m" .metrics)"
  [ -f "$LOGS/$name.pid" ] || continue
  /usr/bin/python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(
    "http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=30).read().decode())' "$(cat "$m")" \
    >"$OUT/metrics-end-$name.txt" || echo "soak: /metrics of $name did not answer" >&2
done
check_alive
kill "$SAMPLER" 2>/dev/null || true
SAMPLER=""
/usr/bin/python3 scripts/soak.py analyze "$OUT"
