// Process-wide CPU settings for serving: the threads of the engine's kernels and of OpenBLAS
// (LibTorch's OpenMP pool stays at one so the pools do not fight over the cores), and an allocator
// that keeps freed buffers instead of returning them to the OS after every forward.
#pragma once

#include <cstdint>
#include <memory>

namespace specula {

class WorkSharingPool;

// BLAS threads; <= 0: one per core (std::thread::hardware_concurrency). Returns the count.
int ConfigureCpuThreads(int64_t threads);

// Threads the engine's own CPU kernels (cpu_kernels) split their work across: the count last
// given to ConfigureCpuThreads, 1 before.
int KernelThreads();

// The pool the kernels split their loops across: KernelThreads() threads counting the caller
// (the caller alone before ConfigureCpuThreads). Shared so that a kernel running while the pool
// is resized keeps the one it started with.
std::shared_ptr<WorkSharingPool> KernelPool();

// glibc malloc: serve large tensors from the heap and keep them (no mmap/munmap per forward, so no
// page faults re-zeroing fresh pages on every step). Call once at startup, before threads start.
void ConfigureAllocatorForServing();

}  // namespace specula
