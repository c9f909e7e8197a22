#include "common/util/work_sharing_pool.h"

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace specula {
namespace {

constexpr uint32_t kClosed = 0xFFFFFFFFu;
// A worker that finished a job spins this long for the next before it sleeps: a forward calls the
// kernels every few microseconds, and waking a sleeping thread costs a system call on both sides.
constexpr auto kSpinBeforeSleep = std::chrono::microseconds(100);

uint32_t Generation(uint64_t ticket) { return static_cast<uint32_t>(ticket >> 32); }
uint32_t Index(uint64_t ticket) { return static_cast<uint32_t>(ticket); }
uint64_t Ticket(uint32_t generation, uint32_t index) {
  return (static_cast<uint64_t>(generation) << 32) | index;
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

WorkSharingPool::WorkSharingPool(int threads, std::function<void()> on_job)
    : on_job_(std::move(on_job)) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

WorkSharingPool::~WorkSharingPool() {
  {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    stop_.store(true);
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void WorkSharingPool::TakeChunks(uint32_t generation) {
  for (;;) {
    uint64_t t = ticket_.load();
    if (Generation(t) != generation) return;
    const uint32_t index = Index(t);
    if (index == kClosed) {  // the job is being described; it opens in a moment
      CpuRelax();
      continue;
    }
    if (index >= chunks_.load()) return;
    const ChunkFn fn = fn_.load();
    const void* ctx = ctx_.load();
    // Succeeds only while the ticket still names this job, so fn/ctx are this job's.
    if (!ticket_.compare_exchange_weak(t, t + 1)) continue;
    fn(ctx, index);
    done_.fetch_add(1);
  }
}

void WorkSharingPool::RunErased(int64_t chunks, const void* ctx, ChunkFn fn) {
  if (chunks <= 0) return;
  std::unique_lock<std::mutex> call(call_mutex_, std::try_to_lock);
  if (workers_.empty() || chunks == 1 || chunks >= kClosed || !call.owns_lock()) {
    for (int64_t c = 0; c < chunks; ++c) fn(ctx, c);
    return;
  }
  const uint32_t generation = ++generation_;
  ticket_.store(Ticket(generation, kClosed));
  fn_.store(fn);
  ctx_.store(ctx);
  chunks_.store(chunks);
  done_.store(0);
  ticket_.store(Ticket(generation, 0));
  if (sleeping_.load() > 0) {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    wake_.notify_all();
  }
  TakeChunks(generation);
  // Every chunk is claimed; wait only for those a running worker is still computing. Yielding
  // after a while lets a worker that was preempted on this core finish its chunk.
  for (int spins = 0; done_.load() < chunks; ++spins) {
    if (spins < 4096) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
}

void WorkSharingPool::WorkerLoop() {
  uint32_t seen = 0;
  for (;;) {
    auto new_job = [&] { return Generation(ticket_.load()) != seen; };
    const auto spin_until = std::chrono::steady_clock::now() + kSpinBeforeSleep;
    for (int spins = 0; !new_job() && !stop_.load(); ++spins) {
      CpuRelax();
      if ((spins & 255) == 255 && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lock(sleep_mutex_);
        sleeping_.fetch_add(1);
        wake_.wait(lock, [&] { return stop_.load() || new_job(); });
        sleeping_.fetch_sub(1);
        break;
      }
    }
    if (stop_.load()) return;
    seen = Generation(ticket_.load());
    if (on_job_) on_job_();
    TakeChunks(seen);
  }
}

}  // namespace specula
