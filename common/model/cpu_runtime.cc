#include "common/model/cpu_runtime.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <malloc.h>

#include <thread>

namespace specula {

int ConfigureCpuThreads(int64_t threads) {
  int n = threads > 0 ? static_cast<int>(threads)
                      : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // LibTorch's OpenMP pool stays at one thread: its workers spin after every parallel region and
  // then compete with OpenBLAS's for the same cores (measured on 2 cores: batch 64 x 5 tokens
  // 1.5-3x slower with both pools at 2). The matmuls, where the time goes, use OpenBLAS's threads.
  at::set_num_threads(1);
  // OpenBLAS keeps its own thread pool (LibTorch does not size it): spinning BLAS threads next to
  // LibTorch's pool cost more than they gain on a small machine. Looked up at run time so that
  // builds against another BLAS (or CUDA-only LibTorch) need nothing.
  using SetThreadsFn = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreadsFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    fn(n);
  }
  return n;
}

void ConfigureAllocatorForServing() {
  // Allocations up to 1 GiB come from the heap, and up to 1 GiB of free heap is kept.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace specula
