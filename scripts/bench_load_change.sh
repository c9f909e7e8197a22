#!/usr/bin/env bash
# The adaptive draft budget under a load change: `specula serve` (all-in-one, --draft-budget
# adaptive) is driven by specula-loadgen at concurrency 1, then 64, then 1 again (PHASES: any other
# profile), while a sampler scrapes /metrics every 0.5 s. Writes OUT.json (the time series:
# delivered tokens/s, mean draft nodes per sequence-step, predicted speedup, spare tokens, running
# requests, the latency bound's p99 gap and p99.9 overrun) and OUT.png (budget, throughput and the
# bound's inputs over time).
#
#   scripts/bench_load_change.sh [OUT]      (default docs/load-change-adaptive)
# Environment: DRAFTER (ngram), PHASE_REQUESTS (24 at c=1, 8x that at c=64), PHASES (the load as
# CONCURRENCY:REQUESTS pairs, e.g. "1:300,4:600,64:2400,1:300"; default "1:N,64:8N,1:N" with N =
# PHASE_REQUESTS), MAX_NEW_TOKENS (48),
# BIN (build/bin: the specula binary's folder, e.g. an older build's), SERVE_FLAGS (more flags for
# `specula serve`, e.g. --step-trace FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-docs/load-change-adaptive}"
MODEL=models/pyllama-6m
BIN="${BIN:-build/bin}"
DRAFTER="${DRAFTER:-ngram}"
N="${PHASE_REQUESTS:-24}"
LOGS="$(mktemp -d)"
trap 'for p in "$LOGS"/*.pid; do [ -f "$p" ] && { kill "$(cat "$p")" 2>/dev/null || true; }; done; rm -rf "$LOGS"' EXIT

# shellcheck source=scripts/serve_lib.sh
source scripts/serve_lib.sh

DRAFTER_FLAGS=(--drafter "$DRAFTER")
case "$DRAFTER" in
  specformer) DRAFTER_FLAGS+=(--specformer-model models/specformer-pyllama-6m) ;;
  beagle | beagle-chain) DRAFTER_FLAGS+=(--beagle-model models/beagle-pyllama-6m) ;;
  draft-model) DRAFTER_FLAGS+=(--drafter-model models/pyllama-draft-1m) ;;
esac
read -r PORT METRICS < <(serve all --model "$MODEL" "${DRAFTER_FLAGS[@]}" --port 0 \
  --metrics-port -1 --draft-budget adaptive ${SERVE_FLAGS:-})
echo "serving on :$PORT, metrics on :$METRICS"

/usr/bin/python3 - "$METRICS" "$LOGS/series.json" <<'PY' &
import json, re, sys, time, urllib.request
port, out = sys.argv[1], sys.argv[2]
def scrape():
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    def val(name):
        m = re.search(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0
    return {"t": time.time(), "tokens": val("specula_generation_tokens_total"),
            "budget_sum": val("specula_draft_budget_nodes_sum"),
            "budget_count": val("specula_draft_budget_nodes_count"),
            "speedup": val("specula_draft_budget_predicted_speedup"),
            "spare": val("specula_draft_budget_spare_tokens"),
            "running": val("specula_num_requests_running"),
            "gap_p99": val("specula_draft_budget_gap_p99_seconds"),
            "overrun_p999": val("specula_draft_budget_overrun_p999_seconds")}
samples = []
try:
    while True:
        samples.append(scrape())
        json.dump(samples, open(out, "w"))
        time.sleep(0.5)
except Exception:
    pass
PY
echo $! >"$LOGS/sampler.pid"

phase() {
  build/bin/specula-loadgen --model "$MODEL" --targets "adaptive=127.0.0.1:$PORT" \
    --drafters "$DRAFTER" --concurrency "$1" --num-prompts "$2" \
    --max-new-tokens "${MAX_NEW_TOKENS:-48}" --repeats 1 --json "$LOGS/phase-$3.json" >/dev/null
  date +%s.%N >>"$LOGS/phases"
}
IFS=, read -r -a LOAD <<<"${PHASES:-1:$N,64:$((N * 8)),1:$N}"
date +%s.%N >"$LOGS/phases"
sleep 2
for i in "${!LOAD[@]}"; do
  phase "${LOAD[$i]%%:*}" "${LOAD[$i]##*:}" "$i"
done
sleep 2
kill "$(cat "$LOGS/sampler.pid")" 2>/dev/null || true
sleep 0.5

/usr/bin/python3 - "$LOGS/series.json" "$LOGS/phases" "$OUT" "$DRAFTER" "${LOAD[*]}" \
  "${SERVE_FLAGS:-}" "$LOGS" <<'PY'
import json, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
samples = json.load(open(sys.argv[1]))
phases = [float(x) for x in open(sys.argv[2]).read().split()]
out, drafter = sys.argv[3], sys.argv[4]
load = [int(p.split(":")[0]) for p in sys.argv[5].split()]
flags = sys.argv[6]
# Each phase as its loadgen run measured it.
phase_results = []
for i, c in enumerate(load):
    r = json.load(open(f"{sys.argv[7]}/phase-{i}.json"))["results"][0]
    phase_results.append({k: r.get(k) for k in (
        "concurrency", "completed", "duration", "output_throughput", "mean_tpot_ms", "p99_itl_ms",
        "mean_accepted_len")})
    print("phase %d, concurrency %d: %.0f tokens/s, TPOT %.2f ms, p99 ITL %.2f ms, accepted %.2f"
          % (i, c, r["output_throughput"], r["mean_tpot_ms"], r.get("p99_itl_ms", 0),
             r["mean_accepted_len"]))
t0 = samples[0]["t"]
series = []
for a, b in zip(samples, samples[1:]):
    dt = b["t"] - a["t"]
    dn = b["budget_count"] - a["budget_count"]
    series.append({"t": b["t"] - t0,
                   "tokens_per_s": (b["tokens"] - a["tokens"]) / dt if dt > 0 else 0,
                   "mean_budget": (b["budget_sum"] - a["budget_sum"]) / dn if dn > 0 else None,
                   "predicted_speedup": b["speedup"], "spare_tokens": b["spare"],
                   "running": b["running"], "gap_p99_ms": b.get("gap_p99", 0) * 1e3,
                   "overrun_p999_ms": b.get("overrun_p999", 0) * 1e3})
json.dump({"drafter": drafter, "phase_ends": [p - t0 for p in phases[1:]],
           "phases": [f"concurrency {c}" for c in load], "serve_flags": flags,
           "phase_results": phase_results, "series": series},
          open(out + ".json", "w"), indent=1)
fig, ax = plt.subplots(4, 1, figsize=(9, 9), sharex=True)
t = [s["t"] for s in series]
ax[0].plot(t, [s["tokens_per_s"] for s in series], color="tab:blue")
ax[0].set_ylabel("tokens/s delivered")
ax[1].plot(t, [s["mean_budget"] if s["mean_budget"] is not None else float("nan") for s in series],
           color="tab:orange")
ax[1].set_ylabel("draft nodes /\nsequence-step")
ax[2].plot(t, [s["running"] for s in series], color="tab:green")
ax[2].set_ylabel("running requests")
# The latency bound's inputs (--max-draft-slowdown): a step may take (1 + X) x the p99 gap less
# the p99.9 overrun of the steps' plans (0 until the tail has 256 steps).
ax[3].plot(t, [s["gap_p99_ms"] for s in series], color="tab:red", label="p99 gap")
ax[3].plot(t, [s["overrun_p999_ms"] for s in series], color="tab:purple",
           label="p99.9 overrun of plans")
ax[3].set_ylabel("ms")
ax[3].legend(loc="upper left", fontsize="small")
ax[3].set_xlabel("seconds")
for a in ax:
    for p in phases[1:-1]:
        a.axvline(p - t0, color="gray", linestyle=":")
fig.suptitle(f"Adaptive draft budget ({drafter}{', ' + flags if flags else ''}), load "
             + " -> ".join(map(str, load)) + " concurrent requests")
fig.tight_layout()
fig.savefig(out + ".png", dpi=90)
print(f"wrote {out}.json and {out}.png")
PY
