#!/usr/bin/env bash
# Two server configurations of one build, measured in one specula-loadgen run: two stacks run side
# by side (the idle one sleeps) and loadgen alternates between them repeat by repeat, so the
# paired ratio of each repeat cancels this machine's drift. Writes OUT-cC.json per concurrency and
# prints A over B per drafter (paired tokens/s per repeat and their median, mean TPOT, p99 ITL).
#
#   scripts/bench_serve_flags.sh OUT "FLAGS_A" "FLAGS_B"
# e.g. scripts/bench_serve_flags.sh /tmp/overlap "--overlap-steps=true" "--overlap-steps=false"
# FLAGS_A / FLAGS_B go to the router (MODE=split) or to the one process (MODE=all).
# Environment: MODE (split: drafter service, target and router over loopback gRPC | all),
# CONCURRENCY ("16 1"), DRAFTERS (none,ngram), REPEATS (4), MAX_NEW_TOKENS (48), BIN (build/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="$1" FLAGS_A="$2" FLAGS_B="$3"
MODE="${MODE:-split}"
MODEL=models/pyllama-6m
BIN="${BIN:-build/bin}"
LOGS="$(mktemp -d)"
trap 'for p in "$LOGS"/*.pid; do [ -f "$p" ] && { kill "$(cat "$p")" 2>/dev/null || true; }; done; rm -rf "$LOGS"' EXIT

# shellcheck source=scripts/serve_lib.sh
source scripts/serve_lib.sh

DRAFTER_FLAGS=(--drafter ngram,specformer --specformer-model models/specformer-pyllama-6m)
start() {  # NAME FLAGS -> the router's port
  local name="$1" flags="$2" dport tport port
  if [ "$MODE" = split ]; then
    read -r dport _ < <(serve "d$name" --role drafter --model "$MODEL" "${DRAFTER_FLAGS[@]}" \
      --port 0 --metrics-port -1)
    # Every drafter at the service (n-gram included), as a three-GPU deployment would have it.
    read -r tport _ < <(serve "t$name" --role target --model "$MODEL" --drafter none \
      --drafter-address "127.0.0.1:$dport" --port 0 --metrics-port -1)
    # shellcheck disable=SC2086
    read -r port _ < <(serve "r$name" --role router --model "$MODEL" \
      --target-address "127.0.0.1:$tport" --port 0 --metrics-port -1 --default-drafter none $flags)
  else
    # shellcheck disable=SC2086
    read -r port _ < <(serve "a$name" --model "$MODEL" "${DRAFTER_FLAGS[@]}" --port 0 \
      --metrics-port -1 --default-drafter none $flags)
  fi
  echo "$port"
}
PORT_A="$(start a "$FLAGS_A")"
PORT_B="$(start b "$FLAGS_B")"
echo "A ($FLAGS_A) on :$PORT_A, B ($FLAGS_B) on :$PORT_B, $MODE"

for c in ${CONCURRENCY:-16 1}; do
  prompts=256
  [ "$c" -lt 16 ] && prompts=128
  "$BIN/specula-loadgen" --model "$MODEL" --targets "a=127.0.0.1:$PORT_A,b=127.0.0.1:$PORT_B" \
    --drafters "${DRAFTERS:-none,ngram}" --concurrency "$c" --max-new-tokens "${MAX_NEW_TOKENS:-48}" \
    --num-prompts "$prompts" --num-warmups 32 --ignore-eos --repeats "${REPEATS:-4}" \
    --percentile-metrics ttft,tpot,itl,token_itl --json "$OUT-c$c.json" --disable-tqdm |
    grep -v repeat
  /usr/bin/python3 - "$OUT-c$c.json" <<'PY'
import json, statistics, sys
results = json.load(open(sys.argv[1]))["results"]
by = {(r["target"], r["drafter"]): r for r in results}
for drafter in sorted({r["drafter"] for r in results}):
    a, b = by[("a", drafter)], by[("b", drafter)]
    def paired(key):
        return [x / y for x, y in zip(a[key], b[key])]
    tps = paired("output_throughput_repeats")
    print(f"c{a['concurrency']:<3} {drafter:<12} A/B tokens/s per repeat "
          f"{' '.join(f'{x:.3f}' for x in tps)}, median {statistics.median(tps):.3f}; "
          f"mean TPOT {statistics.median(paired('mean_tpot_ms_repeats')):.3f}; "
          f"p99 ITL {statistics.median(paired('p99_itl_ms_repeats')):.3f}")
PY
done
