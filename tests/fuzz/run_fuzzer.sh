#!/usr/bin/env bash
# run_fuzzer.sh FUZZER SEED_DIR OUT_DIR SECONDS: runs a libFuzzer target for SECONDS from the seed
# corpus (read-only); new inputs go to OUT_DIR/corpus/<name>/, a crash to OUT_DIR/crash-<name>-*.
# Exits non-zero when the fuzzer finds a crash, leak, timeout or failed invariant.
set -euo pipefail
fuzzer=$1 seeds=$2 out=$3 seconds=$4
name=$(basename "$fuzzer")
mkdir -p "$out/corpus/$name"
exec "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
  -print_final_stats=1 -artifact_prefix="$out/crash-$name-" "$out/corpus/$name" "$seeds"
