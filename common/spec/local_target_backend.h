// The target in this process: a SpecEngine (target model, KV cache, drafters) run by step plans.
// `specula serve --role all` uses it directly; the Target service (services/target) runs one on
// behalf of a remote router.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "common/model/model_runner.h"
#include "common/spec/spec_engine.h"
#include "common/spec/target_backend.h"

namespace specula {

class LocalTargetBackend : public TargetBackend {
 public:
  // With `step_thread`, StartStep hands the plan to a thread of the backend's own and returns at
  // once, so the caller's work between FinishStep and the next StartStep's FinishStep (the
  // router delivering tokens: `specula serve --role all`) runs beside the step; without it
  // FinishStep runs the step on the caller's thread (the Target service).
  LocalTargetBackend(std::unique_ptr<ModelRunner> target, SpecEngineOptions options = {},
                     bool step_thread = false);
  // Waits for a step in flight, then releases the engine.
  ~LocalTargetBackend() override;

  // Add drafters before the first Step.
  SpecEngine& engine() { return *engine_; }
  const ModelRunner& target() const { return *target_; }

  TargetInfo info() const override;
  // A step: cancels first, then admissions (a refused one finishes in the report with
  // FinishReason::kError), then budgets, then one SpecEngine::Step. INVALID_ARGUMENT (nothing run)
  // if the plan admits an id the backend already holds or names the same id twice. An exception
  // from the step (LibTorch, allocation) leaves FinishStep, on whichever thread ran it.
  void StartStep(StepPlan plan) override;
  StatusOr<StepOutcome> FinishStep() override;

  // Cancels every request and runs steps until their KV blocks are freed (a router that went
  // away).
  void CancelAll();
  int32_t num_requests() const { return static_cast<int32_t>(engine_ids_.size()); }

 private:
  StatusOr<StepOutcome> RunStep(const StepPlan& plan);
  void StepThread();

  std::unique_ptr<ModelRunner> target_;
  std::unique_ptr<SpecEngine> engine_;
  std::map<RequestId, RequestId> engine_ids_;  // router id -> engine id
  std::map<RequestId, RequestId> router_ids_;  // engine id -> router id

  // The step in flight: its plan until it runs, then its outcome (or the exception it threw).
  // With a step thread, the thread and the caller hand these over under mu_.
  std::mutex mu_;
  std::condition_variable changed_;
  std::optional<StepPlan> plan_;
  std::optional<StatusOr<StepOutcome>> outcome_;
  std::exception_ptr thrown_;
  bool stopping_ = false;
  std::thread thread_;  // not joinable without `step_thread`
};

}  // namespace specula
