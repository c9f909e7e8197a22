# Shared by the training scripts (train_models.sh, train_drafters.sh, sweep_parallelspec.sh).
# LibTorch's CPU training allocates and frees large activation buffers every step; glibc hands them
# back to the kernel each time (a third of the run in page faults). jemalloc without purging keeps them.
export LD_PRELOAD="${LD_PRELOAD:-/usr/lib/x86_64-linux-gnu/libjemalloc.so.2}"
export MALLOC_CONF="${MALLOC_CONF:-dirty_decay_ms:-1,muzzy_decay_ms:-1}"

# require_distill FILE: stops, saying how to make it, when the self-distillation dataset is missing.
require_distill() {
  [ -f "$1" ] && return 0
  echo "no $1: make it with specula distill (models/README.md)" >&2
  exit 1
}
