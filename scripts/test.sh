#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh -DSPECULA_BUILD_TESTS=ON
# Tests use both cores through LibTorch; running them one at a time keeps timings sane on 2 cores.
ctest --test-dir build --output-on-failure --timeout 600 -j "${CTEST_JOBS:-1}"
