#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in build-fuzz/ (-DSPECULA_FUZZ=ON: ASan + UBSan + libFuzzer)
# and runs each for SECONDS (default 60) from its seed corpus (tests/fuzz/corpus/<target>/).
#   scripts/fuzz.sh [SECONDS] [TARGET...]
# New inputs are kept in build-fuzz/fuzz/corpus/<target>/ (later runs start from them); a crash is
# written to build-fuzz/fuzz/crash-<target>-* and the script exits non-zero. Reproduce one with
#   build-fuzz/fuzz/<target> build-fuzz/fuzz/crash-<target>-...
# then fix it and copy the input into tests/fuzz/corpus/<target>/ as a regression seed.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-60}"
shift || true
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
command -v clang++ >/dev/null || { echo "fuzz: clang++ is missing (apt-get install clang libclang-rt-dev)" >&2; exit 1; }
CC=clang CXX=clang++ cmake -S . -B build-fuzz "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DSPECULA_FUZZ=ON -DSPECULA_BUILD_TESTS=OFF -DSPECULA_FUZZ_SECONDS="$SECONDS_EACH" >/dev/null
cmake --build build-fuzz -j "${JOBS:-$(nproc)}" --target specula_fuzzers
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  ctest --test-dir build-fuzz -L fuzz --output-on-failure --timeout $((SECONDS_EACH * 3 + 60))
else
  for t in "${TARGETS[@]}"; do
    tests/fuzz/run_fuzzer.sh "build-fuzz/fuzz/$t" "tests/fuzz/corpus/$t" build-fuzz/fuzz "$SECONDS_EACH"
  done
fi
