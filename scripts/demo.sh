#!/usr/bin/env bash
# The main job: set up, build, and continue a Python prefix with the bundled model.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_TARGETS=specula scripts/build.sh
MODEL="${MODEL:-models/pyllama-6m}"
PROMPT="${PROMPT:-def read_config(path):
    \"\"\"Read a JSON config file and return it as a dict.\"\"\"
}"
exec build/bin/specula generate --model "$MODEL" --prompt "$PROMPT" --max-new-tokens "${MAX_NEW_TOKENS:-96}" \
  --temperature 0.7 --top-p 0.9 --seed 1 "$@"
