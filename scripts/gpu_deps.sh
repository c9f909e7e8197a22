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
# Compiled caches are not prompts; the device tool copies at most 64 MiB of tree in all.
find "$dir/heldout" -name __pycache__ -type d -prune -exec rm -rf {} +
du -sh "$dir"
tracked=$(git ls-files -z | xargs -0 du -cb 2> /dev/null | tail -1 | cut -f1)
total=$((tracked + $(du -sb "$dir" | cut -f1)))
if ((total > 64 * 1048576)); then
  echo "tracked files + $dir: $((total / 1048576)) MiB, over the device tool's 64 MiB:" \
    "set docs/*.json and docs/**/*.png aside (git checkout docs after the run)"
fi
