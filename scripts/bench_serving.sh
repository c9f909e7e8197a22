#!/usr/bin/env bash
# Serving benchmark: the bundled model served all-in-one (`specula serve`) and as three processes
# (drafter, target, router over loopback gRPC), measured by specula-loadgen in the same run on the
# same held-out prompts, with and without speculation, at several concurrencies. Writes the
# loadgen JSON and the routers' per-step transport overhead (from their /metrics).
#
#   scripts/bench_serving.sh [OUT_PREFIX]     (default docs/bench-serving-pyllama-6m-cpu)
# Environment: CONCURRENCY (1,4,16,64), DRAFTERS (none,ngram,draft-model), MAX_NEW_TOKENS (64),
# REPEATS (3), DRAFT_LEN (4).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-docs/bench-serving-pyllama-6m-cpu}"
MODEL=models/pyllama-6m
DRAFT=models/pyllama-draft-1m
BIN=build/bin
LOGS="$(mktemp -d)"
# serve runs in a subshell (process substitution), so each server's pid goes to a file.
trap 'for p in "$LOGS"/*.pid; do [ -f "$p" ] && { kill "$(cat "$p")" 2>/dev/null || true; }; done; rm -rf "$LOGS"' EXIT

# shellcheck source=scripts/serve_lib.sh
source scripts/serve_lib.sh

DRAFTER_FLAGS=(--drafter ngram,draft-model --drafter-model "$DRAFT")
read -r ALL_PORT ALL_METRICS < <(serve all --model "$MODEL" "${DRAFTER_FLAGS[@]}" --port 0 \
  --metrics-port -1 --default-drafter none)
read -r DRAFTER_PORT _ < <(serve drafter --role drafter --model "$MODEL" "${DRAFTER_FLAGS[@]}" \
  --port 0 --metrics-port -1)
read -r TARGET_PORT _ < <(serve target --role target --model "$MODEL" \
  --drafter-address "127.0.0.1:$DRAFTER_PORT" --port 0 --metrics-port -1)
read -r SPLIT_PORT SPLIT_METRICS < <(serve router --role router --model "$MODEL" \
  --target-address "127.0.0.1:$TARGET_PORT" --port 0 --metrics-port -1 --default-drafter none)
echo "all-in-one on :$ALL_PORT, three processes: router :$SPLIT_PORT -> target :$TARGET_PORT -> drafter :$DRAFTER_PORT"

"$BIN/specula-loadgen" --model "$MODEL" \
  --targets "all=127.0.0.1:$ALL_PORT,split=127.0.0.1:$SPLIT_PORT" \
  --drafters "${DRAFTERS:-none,ngram,draft-model}" --draft-len "${DRAFT_LEN:-4}" \
  --concurrency "${CONCURRENCY:-1,4,16,64}" --max-new-tokens "${MAX_NEW_TOKENS:-64}" \
  --repeats "${REPEATS:-3}" --ignore-eos --json "$OUT.json"

# Per-step cost of the router -> target path, from each router's counters.
/usr/bin/python3 - "$ALL_METRICS" "$SPLIT_METRICS" "$OUT-transport.json" <<'PY'
import json, re, sys, urllib.request
def scrape(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    val = lambda name: float(re.search(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M).group(1))
    steps = val("specula_engine_steps_total")
    return {"steps": steps,
            "mean_step_ms": 1e3 * val("specula_engine_step_seconds_sum") / max(steps, 1),
            "mean_transport_ms_per_step": 1e3 * val("specula_engine_step_transport_seconds_total") / max(steps, 1)}
out = {"all": scrape(sys.argv[1]), "split": scrape(sys.argv[2])}
print(json.dumps(out, indent=2))
json.dump(out, open(sys.argv[3], "w"), indent=2)
PY
