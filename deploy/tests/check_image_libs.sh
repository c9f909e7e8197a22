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
allowed="$(printf '%s\n' $runtime libc6 libgcc-s1 libstdc++6
  apt-cache depends --important $runtime 2>/dev/null | awk '/Depends:/{print $2}' | tr -d '<>')"
missing=0
while read -r lib; do
  path="$(ldd "$binary" | awk -v l="$lib" '$1 == l {print $3}')"
  [ -n "$path" ] || { echo "FAILED: $lib not resolved by ldd" >&2; missing=1; continue; }
  # dpkg knows a file under the path it was installed at: /lib or /usr/lib (merged /usr).
  pkg=""
  for candidate in "$path" "$(readlink -f "$path")" "${path/#\/lib\//\/usr\/lib\/}"; do
    pkg="$(dpkg -S "$candidate" 2>/dev/null | head -1 | cut -d: -f1 || true)"
    [ -n "$pkg" ] && break
  done
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
