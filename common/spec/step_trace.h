// One JSON line per engine step: what the adaptive draft budget planned for it (its predictions
// of the step's seconds and tokens, with and without drafts) next to what the step measured.
// The policy's decisions are only as good as those predictions; a trace shows where they miss
// (a stale price of not drafting, acceptance that runs in streaks, a drafter's catch-up) without
// a rebuild. Written by BudgetPlanner::OnStep when a trace is set (`specula bench`, `generate`
// and `serve` take `--step-trace PATH`). Torch-free.
//
// A line (times in ms; t_ms: when the step's line was written, since the trace was opened;
// "plan" is absent for a step no plan preceded):
//   {"label":"specformer b1","step":17,"t_ms":1234.567,
//    "plan":{"decoding":1,"prefill_tokens":0,"prefill_attention":0,"quiet":true,
//            "audit_off":false,"quiet_steps":0,"nodes":0,"drafting":0,"explored":0,"ms":0.41,
//            "tokens":1.0,"no_draft_ms":0.41,"no_draft_tokens":1.0},
//    "prefill_tokens":0,"verify_tokens":1,"prefill_attention":0,"draft_nodes":0,"accepted":0,
//    "new_tokens":1,"wall_ms":0.43,"target_ms":0.41,"forward_ms":0.40,"draft_ms":0.0,
//    "drafter_calls":[{"drafter":"specformer","sequences":1,"nodes":3,"observed_tokens":3,
//                      "ms":0.19}]}
// (prefill_attention: the prompt chunks' attention work, rows x context after the step, as the
// plan computed it and as the engine reported it.)
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>

#include "common/spec/draft_budget.h"
#include "common/spec/step_contract.h"
#include "common/util/status.h"

namespace specula {

// What a plan decided and predicted, for the trace.
struct TracedPlan {
  StepBase base;
  BudgetDecision decision;
  bool quiet = false;      // a reused quiet plan (DraftBudgetOptions::quiet_replan_every)
  bool audit_off = false;  // planned without drafts by the drafting audit (a no-draft epoch)
};

class StepTrace {
 public:
  // Creates (or truncates) `path`.
  static StatusOr<std::unique_ptr<StepTrace>> Open(const std::string& path);
  ~StepTrace();
  StepTrace(const StepTrace&) = delete;
  StepTrace& operator=(const StepTrace&) = delete;

  // One line for step `step` of `label`: `plan` (null when none preceded the step) and the
  // step's report; wall_seconds is the whole step as its caller saw it (0: not measured). Lines
  // are flushed as written, so the trace of a server that is killed is whole up to its last step.
  void Write(const std::string& label, int64_t step, const TracedPlan* plan,
             const StepReport& report, double wall_seconds);
  int64_t lines() const;

 private:
  explicit StepTrace(std::FILE* file) : file_(file), opened_(std::chrono::steady_clock::now()) {}
  mutable std::mutex mu_;  // planners of several settings (bench) may share one trace
  std::FILE* file_;
  std::chrono::steady_clock::time_point opened_;
  int64_t lines_ = 0;
};

}  // namespace specula
