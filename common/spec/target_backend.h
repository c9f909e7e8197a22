// The transport seam between the router and the target: the router plans each engine step
// (which requests join the batch, which leave, each sequence's draft budget) and the target runs it
// and reports the tokens every sequence produced. Two implementations run the same router code:
// LocalTargetBackend (in process, `specula serve --role all`) and the gRPC client of the Target
// service (services/router/remote_target_backend.h, `--role router`).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/spec/spec_engine.h"
#include "common/util/status.h"

namespace specula {

// Facts about the target that the router plans with; fixed for the life of a target.
struct TargetInfo {
  std::string model_type;
  int32_t vocab_size = 0;
  int32_t context_length = 0;
  std::vector<int32_t> eos_token_ids;
  std::vector<std::string> drafters;  // drafters the target can ask (besides "none")
  int64_t kv_cache_blocks = 0;
  int32_t kv_block_size = 0;
  int32_t max_batch_size = 0;
  std::string dtype;   // of the target's weights and hidden states
  std::string device;  // e.g. "cpu", "cuda:0"
};

// One engine step as the router planned it. Request ids are the router's.
struct StepPlan {
  struct Admission {
    RequestId id = 0;
    SpecRequest request;  // defaults resolved, prompt tokenized
  };
  struct DraftBudget {
    RequestId id = 0;
    int32_t max_draft_tokens = 0;  // tree nodes this step; clamped to the request's maximum
  };
  std::vector<Admission> admit;   // join the batch this step (prefilled in this step's forward)
  std::vector<RequestId> cancel;  // leave the batch; their KV blocks are freed this step
  std::vector<DraftBudget> budgets;

  bool empty() const { return admit.empty() && cancel.empty() && budgets.empty(); }
};

struct StepOutcome {
  StepReport report;  // update ids are the plan's request ids
  int64_t kv_blocks_used = 0;
  double step_seconds = 0;  // the step as the target measured it (transport excluded)
};

class TargetBackend {
 public:
  virtual ~TargetBackend() = default;

  virtual TargetInfo info() const = 0;
  // Runs one step. A request the target refuses (e.g. a drafter it does not have) finishes in
  // the report with reason "error". A non-OK status means the step did not run: the target is
  // unreachable (UNAVAILABLE) or broken, and every request it held is lost.
  virtual StatusOr<StepOutcome> Step(const StepPlan& plan) = 0;
};

}  // namespace specula
