#!/usr/bin/env bash
# Installs the Debian 12 packages Specula builds and tests with. Idempotent: skips apt entirely when
# everything is already installed, and runs `apt-get update` once otherwise.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libopenblas0-pthread            # LibTorch; OpenBLAS, or matmul falls back to reference BLAS (~35x slower)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev
  libpcre2-dev nlohmann-json3-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-torch python3-numpy python3-grpcio python3-protobuf   # reference checks and the Python client example, run with /usr/bin/python3
  python3-matplotlib                                 # specula-loadgen --plot (scripts/plot_loadgen.py)
  libjemalloc2                                       # training runs (scripts/train_models.sh)
  libpython3.11-stdlib                               # the training corpus (/usr/lib/python3.11)
  yamllint prometheus nodejs                         # deploy/ checks: YAML lint, promtool + a real Prometheus, Node.js
  openssl                                            # TLS tests: certificates generated at test time
)
# Installed only when their command is missing: a Node.js from elsewhere (NodeSource) ships its own
# npm and conflicts with Debian's package; likewise a kubectl from Google's repository conflicts
# with kubernetes-client (Debian 12: kubectl 1.20, whose `kubectl kustomize` renders deploy/).
command -v npm >/dev/null || PACKAGES+=(npm)
command -v kubectl >/dev/null || PACKAGES+=(kubernetes-client)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all packages present"
else
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The deploy/ validators' npm packages (Kubernetes schemas), pinned by package-lock.json; again
# only when the lock file changed since the last install.
cd "$(dirname "$0")/../deploy/tests"
if ! [ node_modules/.specula-lock -nt package-lock.json ]; then
  echo "setup: npm ci in deploy/tests"
  npm ci --no-audit --no-fund --loglevel=error
  touch node_modules/.specula-lock
fi
