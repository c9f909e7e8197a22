// Splits one loop across cores for the engine's CPU kernels, built for machines whose cores other
// processes also want (a shared Kubernetes node, a CPU quota, a noisy neighbour). The calling
// thread takes chunks itself and returns as soon as every chunk has run: it never waits for a
// worker that has not started. OpenMP's fork/join waits at the end of every region for all of its
// threads, so one descheduled worker costs a scheduler slice per kernel call; with the 2 cores
// loaded by other jobs that made decoding with 2 threads 7-10x slower than with 1 (measured,
// docs/BENCHMARKS.md). Here a late worker finds no chunk left and costs nothing.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace specula {

class WorkSharingPool {
 public:
  // `threads` counts the caller: threads - 1 workers are started (none for <= 1). `on_job`, when
  // set, runs on a worker each time it sees a new job, before it takes chunks (tests use it to
  // hold workers back, as a busy machine would).
  explicit WorkSharingPool(int threads, std::function<void()> on_job = {});
  ~WorkSharingPool();
  WorkSharingPool(const WorkSharingPool&) = delete;
  WorkSharingPool& operator=(const WorkSharingPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(chunk) once for every chunk in [0, chunks) on the caller and whichever workers are
  // free, and returns when all have returned. A call made while another is running (from another
  // thread, or from inside fn) runs all its chunks on its own caller. fn must not throw.
  template <typename F>
  void Run(int64_t chunks, const F& fn) {
    RunErased(chunks, &fn,
              [](const void* f, int64_t chunk) { (*static_cast<const F*>(f))(chunk); });
  }

 private:
  using ChunkFn = void (*)(const void* ctx, int64_t chunk);
  void RunErased(int64_t chunks, const void* ctx, ChunkFn fn);
  // Takes and runs chunks of job `generation` until none is left or another job started.
  void TakeChunks(uint32_t generation);
  void WorkerLoop();

  std::function<void()> on_job_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one job at a time; held by the caller for the whole job

  // The job: (generation << 32) | next chunk index. A new job first closes the ticket (index
  // kClosed) under its new generation, then writes its description, then opens it at index 0, so
  // a worker can only claim (compare-and-swap) a chunk of the job whose description it read.
  std::atomic<uint64_t> ticket_{0};
  std::atomic<ChunkFn> fn_{nullptr};
  std::atomic<const void*> ctx_{nullptr};
  std::atomic<int64_t> chunks_{0};
  std::atomic<int64_t> done_{0};
  uint32_t generation_ = 0;  // the caller's count, under call_mutex_

  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<int> sleeping_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace specula
