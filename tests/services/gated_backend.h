// A TargetBackend for tests that must see a step boundary: it runs every step on the real
// backend, but a step ends (FinishStep returns) only once the test allows it, and it counts the
// steps started.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

#include "common/spec/target_backend.h"

namespace specula {

class GatedBackend : public TargetBackend {
 public:
  explicit GatedBackend(std::unique_ptr<TargetBackend> inner) : inner_(std::move(inner)) {}
  TargetInfo info() const override { return inner_->info(); }
  void StartStep(StepPlan plan) override {
    inner_->StartStep(std::move(plan));
    started.fetch_add(1);
  }
  StatusOr<StepOutcome> FinishStep() override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      opened_.wait(lock, [&] { return allowed_ > 0; });
      --allowed_;
    }
    return inner_->FinishStep();
  }
  // Lets `steps` more steps end.
  void Allow(int64_t steps) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      allowed_ += steps;
    }
    opened_.notify_all();
  }
  std::atomic<int> started{0};

 private:
  std::unique_ptr<TargetBackend> inner_;
  std::mutex mu_;
  std::condition_variable opened_;
  int64_t allowed_ = 0;
};

}  // namespace specula
