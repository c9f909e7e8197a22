#!/usr/bin/env bash
# Offline checks of deploy/ (CTest: deploy_manifests): yamllint, then every kustomize overlay
# rendered with `kubectl kustomize` and each object validated against the Kubernetes schemas plus
# the deployment rules in validate_manifests.mjs. Finally a few broken variants must be rejected,
# so a validator that accepts everything fails here.
# Exit 77 (CTest: skipped) only where Node.js is missing; scripts/setup.sh installs everything.
set -euo pipefail
cd "$(dirname "$0")/.."  # deploy/
if ! command -v node >/dev/null; then
  echo "SKIPPED: node (Node.js) is not installed; scripts/setup.sh installs nodejs and npm"
  exit 77
fi
for tool in yamllint kubectl; do
  if ! command -v "$tool" >/dev/null; then
    echo "FAILED: $tool is missing; run scripts/setup.sh" >&2
    exit 1
  fi
done
if [ ! -d tests/node_modules/kubernetes-models ]; then
  echo "FAILED: deploy/tests/node_modules is missing; run scripts/setup.sh (npm ci in deploy/tests)" >&2
  exit 1
fi

yamllint -s -c .yamllint.yaml .
echo "yamllint: clean"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
overlays=(kubernetes/overlays/*/)
[ ${#overlays[@]} -ge 2 ] || { echo "FAILED: expected the cpu and gpu-split overlays" >&2; exit 1; }
for dir in "${overlays[@]}"; do
  name="$(basename "$dir")"
  # kustomize v5 warns on stderr that `bases` is deprecated; kept for Debian 12's kustomize v2.
  kubectl kustomize "$dir" >"$work/$name.yaml" 2>"$work/$name.err" || {
    cat "$work/$name.err" >&2
    echo "FAILED: kubectl kustomize $dir" >&2
    exit 1
  }
  node tests/validate_manifests.mjs "$name" <"$work/$name.yaml"
done

# The L7 proxy config against the manifests it fronts (no Envoy binary in Debian).
node tests/validate_envoy.mjs envoy/envoy.yaml <"$work/cpu.yaml"
envoy_rejected() {  # description, sed expression applied to envoy.yaml
  sed -e "$2" envoy/envoy.yaml >"$work/envoy-broken.yaml"
  if cmp -s envoy/envoy.yaml "$work/envoy-broken.yaml"; then
    echo "FAILED: broken envoy variant '$1' changed nothing (stale sed expression)" >&2
    exit 1
  fi
  if node tests/validate_envoy.mjs "$work/envoy-broken.yaml" <"$work/cpu.yaml" >/dev/null 2>&1; then
    echo "FAILED: the envoy check accepted a broken variant: $1" >&2
    exit 1
  fi
  echo "rejected as expected: envoy $1"
}
envoy_rejected "a route to a missing cluster" 's/cluster: specula_routers,/cluster: specula_router,/'
envoy_rejected "the ClusterIP Service as upstream" 's/address: specula-headless\./address: specula./'
envoy_rejected "a health check of another service" 's/service_name: specula.v1.Generation/service_name: specula.v1.Target/'

# Broken variants: each must make the validator fail.
expect_rejected() {  # overlay, description, sed expression applied to its rendering
  local overlay="$1"
  shift
  sed -e "$2" "$work/$overlay.yaml" >"$work/broken.yaml"
  if cmp -s "$work/$overlay.yaml" "$work/broken.yaml"; then
    echo "FAILED: broken variant '$1' changed nothing (stale sed expression)" >&2
    exit 1
  fi
  if node tests/validate_manifests.mjs broken <"$work/broken.yaml" >/dev/null 2>&1; then
    echo "FAILED: the validator accepted a broken variant: $1" >&2
    exit 1
  fi
  echo "rejected as expected: $1"
}
expect_rejected gpu-split "probe port as a string" '0,/port: 50052$/s//port: "50052"/'
expect_rejected gpu-split "the drafter open to any pod" 's/app.kubernetes.io\/component: target$/app.kubernetes.io\/component: router/'
expect_rejected gpu-split "grace period shorter than the drain" 's/terminationGracePeriodSeconds: 40/terminationGracePeriodSeconds: 10/'
expect_rejected gpu-split "an undefined \$(VAR)" 's/\$(SPECULA_DTYPE)/$(SPECULA_DTYPO)/'
expect_rejected gpu-split "an unknown kind" 's/^kind: PodMonitor$/kind: PodMonitr/'
expect_rejected gpu-split "a startup window shorter than the upstream wait" 's/failureThreshold: 130/failureThreshold: 100/'
expect_rejected cpu "an HPA metric the adapter does not serve" 's/name: specula_num_requests_waiting/name: specula_requests_waiting/'
echo "deploy manifests: OK"
