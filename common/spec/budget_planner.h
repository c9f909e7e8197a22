// Drives the adaptive draft budget (draft_budget.h) from the step contract: remembers what the
// policy needs about each request between steps (from the step reports' updates), turns each
// report into a StepMeasurement, and plans the next step's per-request budgets. The router's loop
// (services/router/engine_loop) and the in-process driver (GenerateAll: `specula generate` and
// `specula bench`) use this one class, so every path runs the same policy. Torch-free.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/spec/draft_budget.h"
#include "common/spec/step_contract.h"
#include "common/spec/step_trace.h"

namespace specula {

class BudgetPlanner {
 public:
  // max_step_tokens: the target's per-step token budget (chunked prefill), 0 if unknown.
  explicit BudgetPlanner(DraftBudgetOptions options = {}, int64_t max_step_tokens = 0);

  // A request joins the batch (admitted this step). Requests without speculation are tracked
  // too: their tokens are part of every step's shape.
  void Admit(RequestId id, const SpecRequest& request);
  // After each step: learns from its measurement and updates every request it reports on.
  // wall_seconds: the whole step as its caller saw it (0 if not measured): the part outside the
  // target and the drafters is a fixed per-step overhead in the policy's objective.
  void OnStep(const StepReport& report, double wall_seconds = 0);
  // The request left (finished, cancelled, lost).
  void Forget(RequestId id);

  // Budgets for the next step: one entry per admitted request that can draft.
  std::vector<StepPlan::DraftBudget> Plan();
  const BudgetDecision& last_decision() const { return last_; }
  DraftBudgetPolicy& policy() { return policy_; }
  const DraftBudgetPolicy& policy() const { return policy_; }
  // Writes each step's plan and measurement to `trace` as `label` (null: no trace); the trace
  // must outlive the planner's steps.
  void SetTrace(StepTrace* trace, std::string label) {
    trace_ = trace;
    trace_label_ = std::move(label);
  }

 private:
  struct Tracked {
    std::string drafter;       // "" when the request does not speculate
    int32_t cap = 0;           // the request's max_draft_tokens
    int64_t prompt = 0;        // prompt tokens
    int64_t prefill_left = 0;  // prompt tokens not prefilled yet (estimated from the reports)
    int64_t context = 0;
    int64_t unobserved = 0;
    int32_t max_nodes = 0;    // from the last update
    int64_t tokens_left = 0;  // max_new_tokens less what it generated
    int32_t asked = 0;        // the last plan's budget, until a report says what came of it
    bool decoding = false;
  };

  DraftBudgetPolicy policy_;
  int64_t max_step_tokens_;
  std::map<RequestId, Tracked> tracked_;  // admission order = id order for router ids
  BudgetDecision last_;
  StepTrace* trace_ = nullptr;
  std::string trace_label_;
  TracedPlan traced_;     // the last plan, for the trace
  bool planned_ = false;  // a plan preceded the step OnStep reports
  int64_t traced_steps_ = 0;
};

}  // namespace specula
