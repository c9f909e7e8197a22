#include "common/util/work_sharing_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <set>
#include <thread>
#include <vector>

namespace specula {
namespace {

// Each chunk of each job runs exactly once, whoever runs it.
TEST(WorkSharingPoolTest, EveryChunkRunsExactlyOnce) {
  WorkSharingPool pool(3);
  EXPECT_EQ(pool.threads(), 3);
  for (int64_t chunks : {1, 2, 3, 7, 64, 1000}) {
    for (int job = 0; job < 50; ++job) {
      std::vector<std::atomic<int>> runs(chunks);
      pool.Run(chunks, [&](int64_t c) { runs[c].fetch_add(1); });
      for (int64_t c = 0; c < chunks; ++c) ASSERT_EQ(runs[c].load(), 1) << chunks << " " << c;
    }
  }
}

TEST(WorkSharingPoolTest, NoChunksAndOneThreadRunOnTheCaller) {
  WorkSharingPool pool(1);
  EXPECT_EQ(pool.threads(), 1);
  int calls = 0;
  pool.Run(0, [&](int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
  const auto caller = std::this_thread::get_id();
  pool.Run(5, [&](int64_t) {
    ++calls;
    EXPECT_EQ(std::this_thread::get_id(), caller);
  });
  EXPECT_EQ(calls, 5);
}

// The property the pool exists for: workers that do not get a core (here: held in on_job, as a
// busy machine would deschedule them) cost nothing; the caller runs every chunk and returns.
TEST(WorkSharingPoolTest, CallerFinishesWithoutWorkersThatDoNotStart) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> held{0};
  WorkSharingPool pool(4, [&] {
    held.fetch_add(1);
    released.wait();
  });
  const auto caller = std::this_thread::get_id();
  std::vector<std::atomic<int>> runs(100);
  std::atomic<int> on_caller{0};
  pool.Run(100, [&](int64_t c) {
    runs[c].fetch_add(1);
    if (std::this_thread::get_id() == caller) on_caller.fetch_add(1);
  });
  for (auto& r : runs) EXPECT_EQ(r.load(), 1);
  EXPECT_EQ(on_caller.load(), 100);
  // Later jobs still complete while workers are held, and released workers find nothing to do.
  std::atomic<int> second{0};
  pool.Run(10, [&](int64_t) { second.fetch_add(1); });
  EXPECT_EQ(second.load(), 10);
  release.set_value();
  std::atomic<int> third{0};
  pool.Run(10, [&](int64_t) { third.fetch_add(1); });
  EXPECT_EQ(third.load(), 10);
  for (auto& r : runs) EXPECT_EQ(r.load(), 1);
}

// Running workers do take chunks (the pool is not the caller alone in disguise).
TEST(WorkSharingPoolTest, WorkersTakeChunksWhenTheyRun) {
  WorkSharingPool pool(2);
  const auto caller = std::this_thread::get_id();
  std::atomic<bool> worker_ran{false};
  // Chunks wait (bounded) for a worker to show up, so a free worker gets one.
  for (int job = 0; job < 100 && !worker_ran.load(); ++job) {
    pool.Run(4, [&](int64_t) {
      if (std::this_thread::get_id() != caller) {
        worker_ran.store(true);
        return;
      }
      for (int i = 0; i < 100000 && !worker_ran.load(); ++i) std::this_thread::yield();
    });
  }
  EXPECT_TRUE(worker_ran.load());
}

// A call from inside a chunk, or from another thread while a job runs, runs on its own caller.
TEST(WorkSharingPoolTest, NestedAndConcurrentCallsComplete) {
  WorkSharingPool pool(2);
  std::atomic<int> inner{0};
  pool.Run(8, [&](int64_t) { pool.Run(3, [&](int64_t) { inner.fetch_add(1); }); });
  EXPECT_EQ(inner.load(), 24);

  std::atomic<int64_t> sum{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&] {
      for (int job = 0; job < 200; ++job) pool.Run(16, [&](int64_t c) { sum.fetch_add(c); });
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(sum.load(), 4 * 200 * (15 * 16 / 2));
}

TEST(WorkSharingPoolTest, IdleWorkersSleepAndWakeForTheNextJob) {
  WorkSharingPool pool(2);
  std::atomic<int> runs{0};
  pool.Run(4, [&](int64_t) { runs.fetch_add(1); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the spin: workers sleep
  pool.Run(4, [&](int64_t) { runs.fetch_add(1); });
  EXPECT_EQ(runs.load(), 8);
}

}  // namespace
}  // namespace specula
