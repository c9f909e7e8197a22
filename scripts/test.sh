#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (what CI runs).
#   scripts/test.sh                          Release build in build/, every test
#   scripts/test.sh --sanitize address       ASan + UBSan build in build-asan/
#   scripts/test.sh --sanitize undefined     UBSan build in build-ubsan/
#   scripts/test.sh --sanitize thread        TSan build in build-tsan/
# With --sanitize only the parts that matter are built and run: the tokenizer, KV cache, spec
# (engine, verifier, trees, budget) and services tests (engine loop, internal services over gRPC,
# the Generation service, the real `specula serve` processes) and the fuzz targets. TSan leaves out
# what runs over gRPC (Debian's gRPC and Abseil are not instrumented, so every hand-off through a
# completion queue reads as a race): the engine loop runs in process only, the gRPC services and
# `specula serve` tests are not run. SANITIZE_TESTS (a ctest -R regex) and SANITIZE_TARGETS (build
# targets) override the selection. Any sanitizer report fails the test (halt_on_error);
# suppressions for the uninstrumented system libraries are in scripts/sanitizers/. Extra
# arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
SANITIZE=""
if [ "${1:-}" = "--sanitize" ]; then
  SANITIZE="${2:?--sanitize needs address, undefined or thread}"
  shift 2
fi
scripts/setup.sh
if [ -z "$SANITIZE" ]; then
  scripts/build.sh -DSPECULA_BUILD_TESTS=ON
  # Tests use both cores through LibTorch; running them one at a time keeps timings sane on 2 cores.
  ctest --test-dir build --output-on-failure --timeout 600 -j "${CTEST_JOBS:-1}" "$@"
  exit
fi

case "$SANITIZE" in
  address) BUILD_DIR=build-asan ;;
  undefined) BUILD_DIR=build-ubsan ;;
  thread) BUILD_DIR=build-tsan ;;
  *) echo "test.sh: --sanitize must be address, undefined or thread, got '$SANITIZE'" >&2; exit 2 ;;
esac
TOKENIZER_TESTS="added_vocabulary bpe_model bpe_trainer byte_level decoder json_fields nfc normalizer
  pattern post_processor pre_tokenizer regex stream_decoder tokenizer unicode_nfc_data utf8"
DEFAULT_TARGETS="work_sharing_pool_test block_allocator_test paged_kv_cache_test candidate_tree_test verifier_test
  spec_engine_test spec_sampling_test draft_budget_test engine_loop_test internal_services_test
  generation_service_test stop_strings_test api_token_test tls_test specula_serve_test
  split_serve_test tls_serve_test tokenizer_json_fuzz tokenizer_encode_fuzz safetensors_fuzz
  model_config_fuzz codec_fuzz request_convert_fuzz"
for t in $TOKENIZER_TESTS; do DEFAULT_TARGETS+=" tokenizer_${t}_test"; done
SANITIZE_TARGETS="${SANITIZE_TARGETS:-$DEFAULT_TARGETS}"
# The tests to run: every built one, except under TSan those over gRPC (the header says why);
# there the engine loop's in-process tests run on their own (below).
LOCAL_TESTS="tokenizer_[a-z0-9_]+_test|work_sharing_pool_test|block_allocator_test|paged_kv_cache_test|candidate_tree_test|verifier_test|spec_engine_test|spec_sampling_test|draft_budget_test|stop_strings_test|api_token_test|tls_test|[a-z_]+_fuzz"
GRPC_TESTS="engine_loop_test|internal_services_test|generation_service_test|specula_serve_test|split_serve_test|tls_serve_test"
LOOP_IN_PROCESS=0
if [ "$SANITIZE" = thread ] && [ -z "${SANITIZE_TESTS:-}" ]; then
  SANITIZE_TESTS="^($LOCAL_TESTS)$"
  LOOP_IN_PROCESS=1
fi
SANITIZE_TESTS="${SANITIZE_TESTS:-^($LOCAL_TESTS|$GRPC_TESTS)$}"

export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
# The precompiled LibTorch header (cmake/TorchPch.cmake) is cacheable only with these.
export CCACHE_SLOPPINESS="${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}"
GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
start=$(date +%s)
cmake -S . -B "$BUILD_DIR" "${GENERATOR[@]}" -DCMAKE_BUILD_TYPE=Release -DSPECULA_BUILD_TESTS=ON \
  -DSPECULA_SANITIZE="$SANITIZE" >/dev/null
# shellcheck disable=SC2086
cmake --build "$BUILD_DIR" -j "${JOBS:-$(nproc)}" --target $SANITIZE_TARGETS
built=$(date +%s)

SUPP="$PWD/scripts/sanitizers"
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:detect_odr_violation=0:${ASAN_OPTIONS:-}"
export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$SUPP/ubsan.supp:${UBSAN_OPTIONS:-}"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$SUPP/tsan.supp:${TSAN_OPTIONS:-}"
# Sanitized code runs 2-15x slower: a longer per-test timeout, one test at a time.
status=0
ctest --test-dir "$BUILD_DIR" --output-on-failure --timeout 1800 -j "${CTEST_JOBS:-1}" \
  -R "$SANITIZE_TESTS" "$@" || status=$?
if [ "$LOOP_IN_PROCESS" = 1 ]; then
  echo "engine_loop_test, in-process transport only:"
  "$BUILD_DIR/tests/engine_loop_test" --gtest_filter='*InProcess*' --gtest_brief=1 || status=$?
fi
echo "test.sh --sanitize $SANITIZE: build $((built - start)) s, tests $(($(date +%s) - built)) s"
exit $status
