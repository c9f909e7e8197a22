#!/usr/bin/env bash
# Two server configurations (flags, builds or both), measured in one specula-loadgen run: two
# stacks run side by side (the idle one sleeps) and loadgen alternates between them repeat by repeat, so the
# paired ratio of each repeat cancels this machine's drift. Writes OUT-cC.json per concurrency and
# prints A over B per drafter (paired tokens/s per repeat and their median, mean TPOT, p99 ITL),
# and each stack's CPU time per token served (the router process for MODE=split, the one process
# for MODE=all; warm-ups included), which the other stack's idling hardly disturbs.
#
#   scripts/bench_serve_flags.sh OUT "FLAGS_A" "FLAGS_B"
# e.g. scripts/bench_serve_flags.sh /tmp/overlap "--overlap-steps=true" "--overlap-steps=false"
# FLAGS_A / FLAGS_B go to the router (MODE=split) or to the one process (MODE=all); "" for none.
# Environment: MODE (split: drafter service, target and router over loopback gRPC | all),
# CONCURRENCY ("16 1"), DRAFTERS (none,ngram), REPEATS (4), MAX_NEW_TOKENS (48), BIN (build/bin:
# specula-loadgen's folder and both stacks'), BIN_A / BIN_B (each stack's specula folder, e.g. an
# older build's, for old against new).
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
start() {  # NAME FLAGS SPECULA_FOLDER -> the router's port
  local name="$1" flags="$2" dport tport port
  local BIN="$3"  # serve_lib's serve runs $BIN/specula
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
PORT_A="$(start a "$FLAGS_A" "${BIN_A:-$BIN}")"
PORT_B="$(start b "$FLAGS_B" "${BIN_B:-$BIN}")"
echo "A (${BIN_A:-$BIN} $FLAGS_A) on :$PORT_A, B (${BIN_B:-$BIN} $FLAGS_B) on :$PORT_B, $MODE"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$(cat "$LOGS/$1.pid")/stat"; }
CPU_OF_A=ra CPU_OF_B=rb
[ "$MODE" = split ] || CPU_OF_A=aa CPU_OF_B=ab
for c in ${CONCURRENCY:-16 1}; do
  prompts=256
  [ "$c" -lt 16 ] && prompts=128
  cpu_a0="$(cpu_ticks $CPU_OF_A)" cpu_b0="$(cpu_ticks $CPU_OF_B)"
  "$BIN/specula-loadgen" --model "$MODEL" --targets "a=127.0.0.1:$PORT_A,b=127.0.0.1:$PORT_B" \
    --drafters "${DRAFTERS:-none,ngram}" --concurrency "$c" --max-new-tokens "${MAX_NEW_TOKENS:-48}" \
    --num-prompts "$prompts" --num-warmups 32 --ignore-eos --repeats "${REPEATS:-4}" \
    --percentile-metrics ttft,tpot,itl,token_itl --json "$OUT-c$c.json" --disable-tqdm |
    grep -v repeat
  cpu_a=$(($(cpu_ticks $CPU_OF_A) - cpu_a0)) cpu_b=$(($(cpu_ticks $CPU_OF_B) - cpu_b0))
  /usr/bin/python3 - "$OUT-c$c.json" "$cpu_a" "$cpu_b" "$(getconf CLK_TCK)" <<'PY'
import json, statistics, sys
report = json.load(open(sys.argv[1]))
results = report["results"]
for label, ticks in (("a", int(sys.argv[2])), ("b", int(sys.argv[3]))):
    mine = [r for r in results if r["target"] == label]
    tokens = sum(r["total_output_tokens"] * len(r["output_throughput_repeats"]) +
                 r["num_warmups"] * r["max_new_tokens"] for r in mine)
    print(f"{label.upper()}: {ticks / int(sys.argv[4]) / tokens * 1e6:.1f} us of CPU per token "
          f"({tokens} tokens)")
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
