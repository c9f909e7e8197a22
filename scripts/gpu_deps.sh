#!/usr/bin/env bash
# Copies what scripts/gpu_check.sh needs besides LibTorch from this Debian machine into DIR (default
# .devdeps, git-ignored locally via .git/info/exclude), for a GPU machine that has PyTorch, CMake and
# nvcc but no package manager: nlohmann_json (header-only), PCRE2's header and library, GoogleTest's
# static libraries with their CMake files, and the held-out prompts (/usr/lib/python3.11/test) that
# the benchmarks and the lossless tests cut their prompts from.
# Usage: scripts/gpu_deps.sh [DIR]
set -euo pipefail
dir=${1:-.devdeps}
lib=/usr/lib/x86_64-linux-gnu
for f in /usr/include/nlohmann /usr/share/cmake/nlohmann_json /usr/include/pcre2.h \
         $lib/libpcre2-8.so /usr/include/gtest $lib/cmake/GTest /usr/lib/python3.11/test; do
  [[ -e $f ]] || { echo "missing $f: run scripts/setup.sh first" >&2; exit 1; }
done
rm -rf "$dir"
mkdir -p "$dir/usr/include" "$dir/usr/lib/x86_64-linux-gnu/cmake" "$dir/usr/share/cmake" \
         "$dir/heldout"
cp -r /usr/include/nlohmann /usr/include/gtest /usr/include/gmock /usr/include/pcre2.h \
      "$dir/usr/include/"
cp -r /usr/share/cmake/nlohmann_json "$dir/usr/share/cmake/"
cp -a $lib/libpcre2-8.so* $lib/libgtest*.a $lib/libgmock*.a "$dir/usr/lib/x86_64-linux-gnu/"
cp -r $lib/cmake/GTest "$dir/usr/lib/x86_64-linux-gnu/cmake/"
cp -r /usr/lib/python3.11/test/. "$dir/heldout/"
du -sh "$dir"
