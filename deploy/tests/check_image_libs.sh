#!/usr/bin/env bash
# CTest deploy_image_libs: the runtime stage of deploy/Dockerfile installs every shared library the
# built `specula` needs. The image itself cannot be built here (no base image), so this checks the
# package list instead: each DT_NEEDED library of the binary, resolved by ldd and mapped to its
# Debian package with dpkg -S, must come from a package the runtime stage installs, one of their
# direct dependencies, or the base image's C/C++ runtime.
# Usage: check_image_libs.sh SPECULA_BINARY
set -euo pipefail
binary="$1"
dockerfile="$(dirname "$0")/../Dockerfile"
# The package names of the last `apt-get install` (the runtime stage).
runtime="$(awk '/^FROM /{block=""} /apt-get install/{grab=1} grab{block=block" "$0} /rm -rf \/var\/lib\/apt/{grab=0} END{print block}' "$dockerfile" |
  tr ' \\' '\n\n' | grep -E '^lib[a-z0-9.+-]+$' | sort -u)"
[ -n "$runtime" ] || { echo "FAILED: no runtime packages found in $dockerfile" >&2; exit 1; }
# Direct dependencies from dpkg's own database (works without apt lists; the build machine has
# these runtime packages installed as dependencies of their -dev packages).
allowed="$(printf '%s\n' $runtime libc6 libgcc-s1 libstdc++6
  for p in $runtime; do
    dpkg-query -W -f='${Depends}, ${Pre-Depends}\n' "$p" 2>/dev/null || true
  done | tr ',|' '\n\n' | awk '{print $1}' | sed 's/:any$//' | grep -v '^$')"
missing=0
resolved="$(ldd "$binary")"
while read -r lib; do
  path="$(awk -v l="$lib" '$1 == l {print $3}' <<<"$resolved")"
  [ -n "$path" ] || { echo "FAILED: $lib not resolved by ldd" >&2; missing=1; continue; }
  # dpkg knows a file under the path it was installed at: /lib or /usr/lib (merged /usr).
  pkg="$(dpkg -S "$path" "$(readlink -f "$path")" "${path/#\/lib\//\/usr\/lib\/}" 2>/dev/null |
    head -1 | cut -d: -f1 || true)"
  if [ -z "$pkg" ]; then
    echo "FAILED: $lib ($path) belongs to no Debian package" >&2
    missing=1
  elif ! grep -qx "$pkg" <<<"$allowed"; then
    echo "FAILED: $lib comes from $pkg, which the Dockerfile's runtime stage does not install" >&2
    missing=1
  else
    echo "$lib: $pkg"
  fi
done < <(readelf -d "$binary" | awk '/NEEDED/{gsub(/[][]/, "", $5); print $5}')
[ "$missing" -eq 0 ] && echo "deploy image libs: OK"
exit "$missing"
