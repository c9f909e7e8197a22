#include "common/model/cpu_runtime.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>

#include "common/util/work_sharing_pool.h"

namespace specula {
namespace {
std::atomic<int> g_kernel_threads{1};

std::string Lowercase(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}
std::mutex g_pool_mutex;
std::shared_ptr<WorkSharingPool> g_pool;  // null: the caller alone

// OPENBLAS_THREAD_TIMEOUT as OpenBLAS reads it (openblas_read_env), or 0 when the BLAS is not
// OpenBLAS.
int LoadedBlasThreadTimeout() {
  using TimeoutFn = int (*)();
  auto timeout = reinterpret_cast<TimeoutFn>(dlsym(RTLD_DEFAULT, "openblas_thread_timeout"));
  return timeout ? timeout() : 0;
}
}  // namespace

int BoundBlasThreadSpin() {
  static const int bound = [] {
    using VoidFn = void (*)();
    using IntFn = int (*)();
    auto read_env = reinterpret_cast<VoidFn>(dlsym(RTLD_DEFAULT, "openblas_read_env"));
    auto shutdown = reinterpret_cast<IntFn>(dlsym(RTLD_DEFAULT, "blas_thread_shutdown_"));
    if (read_env == nullptr || shutdown == nullptr) return LoadedBlasThreadTimeout();
    if (std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr) {  // else the user's choice stands
      setenv("OPENBLAS_THREAD_TIMEOUT", std::to_string(kBlasThreadTimeoutLog2).c_str(), 1);
      read_env();
      // The threads read the bound when they start: the next matmul starts them again.
      shutdown();
    }
    return LoadedBlasThreadTimeout();
  }();
  return bound;
}

std::shared_ptr<WorkSharingPool> KernelPool() {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  return g_pool;
}

int KernelThreads() { return g_kernel_threads.load(std::memory_order_relaxed); }

int ConfigureCpuThreads(int64_t threads) {
  const int n = threads > 0 ? static_cast<int>(threads)
                            : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // The matmuls, where the time goes, run on OpenBLAS's pool; LibTorch's OpenMP pool stays at one
  // thread. Measured on 2 cores (docs/BENCHMARKS.md): both pools at 2 made batch 64 x 5 tokens
  // 1.5-3x slower (the pools' spinning workers fight over the cores), and one OpenMP pool of 2
  // with single-threaded BLAS inside it was 1.5x slower than this. Looked up at run time so that
  // builds against another BLAS (or a CUDA-only LibTorch) need nothing.
  at::set_num_threads(1);
  BoundBlasThreadSpin();
  using SetThreadsFn = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreadsFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(n);
  }
  g_kernel_threads.store(n, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (!g_pool || g_pool->threads() != n) {
    g_pool = n > 1 ? std::make_shared<WorkSharingPool>(n) : nullptr;
  }
  return n;
}

CpuVectorFeatures DetectCpuVectorFeatures() {
  CpuVectorFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
  f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
#endif
  return f;
}

std::string BetterBlasCore(const std::string& loaded, const CpuVectorFeatures& cpu) {
  const std::string core = Lowercase(loaded);
  // Cores whose sgemm uses AVX-512, then AVX2 + FMA (OpenBLAS 0.3.x names).
  const bool has_avx512 = core == "skylakex" || core == "cooperlake" || core == "sapphirerapids";
  const bool has_avx2 = has_avx512 || core == "haswell" || core == "zen";
  if (cpu.avx512 && !has_avx512) return "SkylakeX";
  if (cpu.avx2_fma && !has_avx2) return "Haswell";
  return "";
}

std::string LoadedBlasCore() {
  using CoreNameFn = char* (*)();
  auto core_name = reinterpret_cast<CoreNameFn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const char* name = core_name ? core_name() : nullptr;
  return name ? name : "";
}

bool SwitchBlasCoreInProcess(const std::string& core) {
  using Fn = void (*)();
  auto quit = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  auto init = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (quit == nullptr || init == nullptr) return false;
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  quit();
  init();
  return Lowercase(LoadedBlasCore()) == Lowercase(core);
}

void UseFasterBlasKernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;  // the user's choice, or relaunched
  if (std::getenv("SPECULA_NO_BLAS_RELAUNCH") != nullptr) return;
  const std::string loaded = LoadedBlasCore();
  if (loaded.empty()) return;  // not OpenBLAS
  const std::string better = BetterBlasCore(loaded, DetectCpuVectorFeatures());
  if (better.empty()) return;
  // Sets OPENBLAS_CORETYPE, also for the processes this one starts (they load the right kernels
  // at once) and for the exec below.
  if (SwitchBlasCoreInProcess(better)) return;
  setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  // No dispatcher to re-run (an OpenBLAS built for one core, or another BLAS): exec once more,
  // with OPENBLAS_CORETYPE set for the loader. The binary's own path, not /proc/self/exe: the
  // process would be named "exe" in ps and top.
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return;
  self[n] = '\0';
  execv(self, argv);
  // exec failed: carry on with the kernels OpenBLAS has.
}

void ConfigureAllocatorForServing() {
  // Allocations up to 1 GiB come from the heap, and up to 1 GiB of free heap is kept.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace specula
