// Process-wide CPU settings for serving: the matmuls' threads (OpenBLAS's pool; LibTorch's OpenMP
// pool stays at one so the two do not fight over the cores), and an allocator that keeps freed
// buffers instead of returning them to the OS after every forward.
#pragma once

#include <cstdint>

namespace specula {

// BLAS threads; <= 0: one per core (std::thread::hardware_concurrency). Returns the count.
int ConfigureCpuThreads(int64_t threads);

// Threads the engine's own CPU kernels (cpu_kernels) split their work across: the count last
// given to ConfigureCpuThreads, 1 before.
int KernelThreads();

// glibc malloc: serve large tensors from the heap and keep them (no mmap/munmap per forward, so no
// page faults re-zeroing fresh pages on every step). Call once at startup, before threads start.
void ConfigureAllocatorForServing();

}  // namespace specula
