#!/usr/bin/env bash
# scripts/soak.sh at a tiny size, all-in-one and as three processes with a drafter restart, so the
# script keeps working: every request answered, greedy outputs equal to their references, no
# unexpected error, no server death. RSS flatness is not judged at this size (RSS_LIMIT_PCT=100).
#
#   tests/loadgen/soak_test.sh SOURCE_DIR BINARY_DIR
set -euo pipefail
SOURCE_DIR="$1"
BIN="$2/bin"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
for mode in all-in-one split; do
  if ! BIN="$BIN" MODE="$mode" REQUESTS=16 CHUNKS=2 WARMUP_CHUNKS=1 PROMPTS=1 IDLE_S=1 \
    RSS_LIMIT_PCT=100 RESTART_AFTER_S=1 RESTART_DOWN_S=1 RSS_INTERVAL_S=1 \
    "$SOURCE_DIR/scripts/soak.sh" "$OUT/$mode" >"$OUT/$mode.log" 2>&1; then
    echo "FAIL: soak.sh MODE=$mode"
    cat "$OUT/$mode.log"
    exit 1
  fi
  /usr/bin/python3 - "$OUT/$mode/summary.json" "$mode" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["verdict"] == "PASS", s
assert s["requests"] == 16 and s["results"] == 16 and s["lost"] == 0, s
assert s["greedy_checked"] > 0 and s["greedy_mismatches"] == 0, s
assert s["rss"] and all(x["samples"] > 0 for x in s["rss"]), s
assert s["drafter_restarts"] == (1 if sys.argv[2] == "split" else 0), s
PY
  echo "ok: $mode ($(grep -o 'answered in [0-9]* s' "$OUT/$mode.log"))"
done
