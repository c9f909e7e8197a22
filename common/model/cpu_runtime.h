// Process-wide CPU settings for serving: the threads of the engine's kernels and of OpenBLAS
// (LibTorch's OpenMP pool stays at one so the pools do not fight over the cores), and an allocator
// that keeps freed buffers instead of returning them to the OS after every forward.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace specula {

class WorkSharingPool;

// BLAS threads; <= 0: one per core (std::thread::hardware_concurrency). Returns the count.
// Bounds OpenBLAS's spinning first (BoundBlasThreadSpin).
int ConfigureCpuThreads(int64_t threads);

// OpenBLAS's threads spin on sched_yield for 2^OPENBLAS_THREAD_TIMEOUT cycles after each matmul
// before they sleep: 2^28 by default, ~0.1 s. Every prompt prefilled through LibTorch's matmul
// (more than 32 rows) thus left a thread spinning beside the next ~0.1 s of decoding steps, whose
// kernels run on their own pool: on 2 cores at concurrency 4, a drafter service spent 0.5-0.8 s
// of CPU per 3.5 s run spinning (its calls took 0.05 s) and the target beside it ran at 0.83-0.87x
// of no speculation without drafting. Sets the timeout to kBlasThreadTimeoutLog2 (~0.1 ms, the
// engine pool's own spin: long enough for the gaps between one forward's matmuls) and restarts
// the threads, unless the user set OPENBLAS_THREAD_TIMEOUT. Once per process, before any matmul
// runs on another thread. Returns the timeout OpenBLAS now uses (0: not OpenBLAS).
inline constexpr int kBlasThreadTimeoutLog2 = 18;
int BoundBlasThreadSpin();

// Threads the engine's own CPU kernels (cpu_kernels) split their work across: the count last
// given to ConfigureCpuThreads, 1 before.
int KernelThreads();

// The pool the kernels split their loops across: KernelThreads() threads counting the caller
// (the caller alone before ConfigureCpuThreads). Shared so that a kernel running while the pool
// is resized keeps the one it started with.
std::shared_ptr<WorkSharingPool> KernelPool();

// OpenBLAS chooses its kernels from the CPU model when it loads, before main. On virtual machines
// that hide the model (e.g. "Intel(R) Xeon(R) Processor") it falls back to its SSE3 "Prescott"
// kernels although the CPU has AVX2 or AVX-512: measured 2-3x slower matmuls above 256 rows
// (docs/BENCHMARKS.md). The OpenBLAS core to ask for instead (OPENBLAS_CORETYPE), or "" when
// `loaded` (openblas_get_corename) is already as good as the CPU allows or the CPU has neither.
struct CpuVectorFeatures {
  bool avx2_fma = false;
  bool avx512 = false;       // F, CD, BW, DQ and VL: what OpenBLAS's SkylakeX kernels use
  bool avx512_bf16 = false;  // and AVX512-BF16 (SmallMatmulBf16Raw)
};
CpuVectorFeatures DetectCpuVectorFeatures();
// The kernels OpenBLAS loaded (openblas_get_corename), or "" when the BLAS is not OpenBLAS.
std::string LoadedBlasCore();
std::string BetterBlasCore(const std::string& loaded, const CpuVectorFeatures& cpu);

// OpenBLAS built with DYNAMIC_ARCH (Debian's) exports its kernel dispatcher's quit and init; init
// reads OPENBLAS_CORETYPE and installs that core's kernel table and blocking parameters. Sets
// OPENBLAS_CORETYPE to `core` and re-runs the dispatcher: true when OpenBLAS then reports `core`.
// Only between BLAS calls (nothing may be running on OpenBLAS's threads).
bool SwitchBlasCoreInProcess(const std::string& core);

// Call first in main(), before any matmul: when OpenBLAS loaded weaker kernels than the CPU
// supports and the user did not set OPENBLAS_CORETYPE, sets it to BetterBlasCore's choice and
// switches OpenBLAS to those kernels in this process (re-running its DYNAMIC_ARCH dispatcher;
// free). Where that is not possible it re-executes the process once (its own binary, same
// arguments), which loads LibTorch's libraries twice (~0.5 s more start-up). Does nothing when
// SPECULA_NO_BLAS_RELAUNCH is set.
void UseFasterBlasKernels(char** argv);

// glibc malloc: serve large tensors from the heap and keep them (no mmap/munmap per forward, so no
// page faults re-zeroing fresh pages on every step). Call once at startup, before threads start.
void ConfigureAllocatorForServing();

}  // namespace specula
