#!/usr/bin/env bash
# The main job: set up, build, serve the bundled model (`specula serve`: gRPC API, speculative
# decoding with the n-gram drafter) and generate from it with the Python client over gRPC.
# Extra arguments go to the client (e.g. --temperature 0 --drafter none --max-new-tokens 32).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_TARGETS="specula specula_python_stubs" scripts/build.sh
MODEL="${MODEL:-models/pyllama-6m}"
PROMPT="${PROMPT:-def read_config(path):
    \"\"\"Read a JSON config file and return it as a dict.\"\"\"
}"

LOG="$(mktemp)"
build/bin/specula serve --model "$MODEL" --port 0 --metrics-port 0 > "$LOG" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null; rm -f "$LOG"' EXIT
# The server prints "specula serve: listening on HOST:PORT (...)" once it accepts requests.
for _ in $(seq 1 600); do
  grep -q "listening on" "$LOG" && break
  kill -0 "$SERVER" 2>/dev/null || { cat "$LOG" >&2; exit 1; }
  sleep 0.1
done
ADDRESS="$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$LOG" | head -n1)"
[ -n "$ADDRESS" ] || { cat "$LOG" >&2; echo "demo: the server did not start" >&2; exit 1; }
echo "specula serve is listening on $ADDRESS; streaming a completion:" >&2
/usr/bin/python3 examples/python/generate_client.py --stubs build/python --target "$ADDRESS" \
  --mode stream --prompt "$PROMPT" --max-new-tokens "${MAX_NEW_TOKENS:-96}" \
  --temperature 0.7 --top-p 0.9 --seed 1 "$@"
