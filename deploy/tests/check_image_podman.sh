#!/usr/bin/env bash
# The runtime stage of deploy/Dockerfile, built for real with podman on a Debian 12 base made by
# debootstrap (registries cannot be reached here, the Debian mirror can), around the `specula`
# built on this machine: the image installs, runs as uid 10001, and `specula serve` in it answers
# gRPC health checks and /metrics from the host.
#
# The build stage is not run: it compiles Specula from scratch inside the image (well over an
# hour on this 2-core machine, no ccache). Its output is what this checkout's build/ holds, built
# from the same Debian 12 packages, so the runtime stage gets the same files.
#
# Usage: SPECULA_IMAGE_TEST=1 check_image_podman.sh SPECULA_BINARY [ROOTFS]
#   ROOTFS: a debootstrap'd Debian 12 (default $SPECULA_IMAGE_ROOTFS or
#   /tmp/specula-debian12-rootfs; made there when missing: debootstrap --variant=minbase).
# CTest deploy_image_podman (label image). Needs root, podman, runc, debootstrap and the Debian
# mirror, and takes minutes: opt-in, so exit 77 (skipped) unless SPECULA_IMAGE_TEST=1, and where
# a tool is missing (apt-get install podman runc debootstrap).
set -euo pipefail
if [ "${SPECULA_IMAGE_TEST:-}" != 1 ]; then
  echo "SKIPPED: opt-in (needs root, podman, the Debian mirror, minutes): SPECULA_IMAGE_TEST=1"
  exit 77
fi
binary="$(readlink -f "$1")"
rootfs="${2:-${SPECULA_IMAGE_ROOTFS:-/tmp/specula-debian12-rootfs}}"
source_dir="$(cd "$(dirname "$0")/../.." && pwd)"
for tool in podman debootstrap runc; do
  command -v "$tool" >/dev/null || { echo "SKIPPED: $tool is not installed (apt-get install $tool)"; exit 77; }
done
# runc: crun (podman's default) refuses hybrid cgroup v1/v2 hosts such as this sandbox; explicit
# limits: podman's default ones (nofile 1048576) exceed what an unprivileged sandbox may set.
podman() { command podman --runtime runc "$@"; }
limits=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
work="$(mktemp -d)"
name="specula-image-test-$$"
cleanup() {
  podman rm -f "$name" >/dev/null 2>&1 || true
  podman rmi -f localhost/specula-runtime-test:latest >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# 1. The base image: debian:12-slim as the Dockerfile names it, from a local root file system.
if [ ! -x "$rootfs/usr/bin/apt-get" ]; then
  debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian
fi
tar -C "$rootfs" -c . | podman import --change 'CMD ["bash"]' - docker.io/library/debian:12-slim >/dev/null

# 2. The runtime stage (from the last FROM on), with the build stage's /out/ taken from here.
mkdir -p "$work/out/usr/local/bin" "$work/out/opt/specula"
install -m 0755 "$binary" "$work/out/usr/local/bin/specula"
cp -r "$source_dir/models" "$work/out/opt/specula/models"
awk '/^FROM /{stage=""} {stage=stage $0 "\n"} END{printf "%s", stage}' "$source_dir/deploy/Dockerfile" |
  sed 's|^COPY --from=build /out/ /$|COPY out/ /|' >"$work/Containerfile"
grep -q '^COPY out/ /$' "$work/Containerfile" || { echo "FAILED: no COPY --from=build /out/ / in the runtime stage" >&2; exit 1; }
podman build --pull=never --network=host "${limits[@]}" -f "$work/Containerfile" -t localhost/specula-runtime-test:latest "$work"

# 3. Runs as the non-root user; `specula` finds every library; serve answers a request.
user="$(podman run --rm --network=host "${limits[@]}" --entrypoint id localhost/specula-runtime-test:latest -u)"
[ "$user" = 10001 ] || { echo "FAILED: the image runs as uid $user, not 10001" >&2; exit 1; }
podman run --rm --network=host "${limits[@]}" localhost/specula-runtime-test:latest --version
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
metrics=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
# The image's default command with ports of our own (host network: no port publishing needed).
podman run -d --name "$name" --network=host "${limits[@]}" localhost/specula-runtime-test:latest \
  serve --host=127.0.0.1 --port "$port" --metrics-port "$metrics" >/dev/null
for _ in $(seq 1 120); do
  curl -sf "http://127.0.0.1:$metrics/metrics" -o "$work/metrics.txt" && break
  sleep 1
done
grep -q '^specula_num_requests_running' "$work/metrics.txt" ||
  { podman logs "$name" >&2; echo "FAILED: no /metrics from the container" >&2; exit 1; }
# A real request through the public API (the bundled model, found at the relative default path).
/usr/bin/python3 "$source_dir/examples/python/generate_client.py" --target "127.0.0.1:$port" \
  --stubs "$(dirname "$binary")/../python" --prompt $'import os\n' --max-new-tokens 8 --mode unary
echo "deploy image (runtime stage, podman): OK, $(podman image inspect localhost/specula-runtime-test:latest --format '{{.Size}}') bytes"
