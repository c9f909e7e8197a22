// The target in this process: a SpecEngine (target model, KV cache, drafters) run by step plans.
// `specula serve --role all` uses it directly; the Target service (services/target) runs one on
// behalf of a remote router.
#pragma once

#include <map>
#include <memory>

#include "common/model/model_runner.h"
#include "common/spec/spec_engine.h"
#include "common/spec/target_backend.h"

namespace specula {

class LocalTargetBackend : public TargetBackend {
 public:
  LocalTargetBackend(std::unique_ptr<ModelRunner> target, SpecEngineOptions options = {});
  ~LocalTargetBackend() override;

  // Add drafters before the first Step.
  SpecEngine& engine() { return *engine_; }
  const ModelRunner& target() const { return *target_; }

  TargetInfo info() const override;
  // Cancels first, then admissions (a refused one finishes in the report with
  // FinishReason::kError), then budgets, then one SpecEngine::Step. INVALID_ARGUMENT (nothing run)
  // if the plan admits an id the backend already holds or names the same id twice.
  StatusOr<StepOutcome> Step(const StepPlan& plan) override;

  // Cancels every request and runs steps until their KV blocks are freed (a router that went
  // away).
  void CancelAll();
  int32_t num_requests() const { return static_cast<int32_t>(engine_ids_.size()); }

 private:
  std::unique_ptr<ModelRunner> target_;
  std::unique_ptr<SpecEngine> engine_;
  std::map<RequestId, RequestId> engine_ids_;  // router id -> engine id
  std::map<RequestId, RequestId> router_ids_;  // engine id -> router id
};

}  // namespace specula
