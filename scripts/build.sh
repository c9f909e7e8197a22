#!/usr/bin/env bash
# Configures and builds Specula (Release) into build/. Extra arguments go to CMake's configure step,
# e.g. scripts/build.sh -DSPECULA_WITH_GRPC=OFF. BUILD_TARGETS="specula" builds only those targets.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${JOBS:-$(nproc)}"
# Paths relative to the checkout in ccache's hashes, so clones and worktrees share cache hits.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
# The precompiled LibTorch header (cmake/TorchPch.cmake) is cacheable only with these.
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
if [ -f build/CMakeCache.txt ] && ! grep -q "CMAKE_GENERATOR:INTERNAL=${GENERATOR[1]:-Unix Makefiles}" build/CMakeCache.txt; then
  rm -rf build
fi
cmake -S . -B build "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
# shellcheck disable=SC2086
cmake --build build -j "$JOBS" ${BUILD_TARGETS:+--target $BUILD_TARGETS}
