// The router <-> target contract: what a request asks for (SpecRequest), one engine step as the
// router plans it (StepPlan) and what the target reports back (StepOutcome: per-request updates and
// the step's measured shape and costs, which the adaptive draft budget learns from). Torch-free:
// the router, the Target service's codec and the in-process engine all speak it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/engine/finish_reason.h"
#include "common/engine/generation_request.h"
#include "common/spec/draft_budget.h"
#include "common/spec/verifier.h"
#include "common/util/status.h"

namespace specula {

using RequestId = int64_t;

struct SpeculationSettings {
  std::string drafter;           // "" or "none": no speculation
  int32_t max_draft_tokens = 4;  // tree nodes per step (the per-sequence draft budget)
  VerifyParams verify;

  bool enabled() const { return !drafter.empty() && drafter != "none" && max_draft_tokens > 0; }
};

struct SpecRequest {
  GenerationRequest generation;
  SpeculationSettings speculation;
};

struct SpecRequestStats {
  int64_t steps = 0;            // verification steps after prefill
  int64_t draft_steps = 0;      // steps that verified a non-empty tree
  int64_t draft_tokens = 0;     // tree nodes proposed
  int64_t draft_depth = 0;      // sum over drafting steps of the tree's depth
  int64_t accepted_tokens = 0;  // draft tokens accepted (bonus tokens not counted)
  // accepted_per_position[d]: draft tokens accepted at depth d + 1.
  std::vector<int64_t> accepted_per_position;
  int64_t draft_errors = 0;  // trees dropped (invalid tree or drafter failure)
  std::string last_draft_error;
  bool lossy = false;  // verified with a lossy rule

  // Tokens produced per verification step (accepted draft tokens + the target's own token).
  double mean_accepted_len() const {
    return steps > 0 ? static_cast<double>(accepted_tokens + steps) / static_cast<double>(steps)
                     : 0;
  }
};

struct RequestUpdate {
  RequestId id = 0;
  std::vector<int32_t> new_tokens;  // generated this step (after stop/length truncation)
  bool finished = false;
  // When finished: kStop, kLength, kCancelled or kError (the engine never sees stop strings).
  FinishReason finish_reason = FinishReason::kLength;
  Status error;            // set when finish_reason is kError
  SpecRequestStats stats;  // running totals
  // This step's draft: tree nodes verified, the tree's depth, nodes accepted (0s: no draft).
  int32_t draft_nodes = 0;
  int32_t draft_depth = 0;
  int32_t draft_accepted = 0;
  // For planning the next step: the sequence's cache length, the tokens its drafter has not
  // observed yet (it catches up before its next draft), and the most draft nodes the next step
  // can give it (its request's cap, the context and max_new_tokens left; 0 when it has no
  // drafter or is still prefilling).
  int64_t context_tokens = 0;
  int64_t unobserved_tokens = 0;
  int32_t max_draft_nodes = 0;
};

struct StepReport {
  std::vector<RequestUpdate> updates;
  int32_t batch_size = 0;      // sequences in the target forward
  int64_t prefill_tokens = 0;  // prompt tokens (chunks) prefilled this step
  int64_t verify_tokens = 0;   // pending + tree tokens of running sequences
  double draft_seconds = 0;    // drafter Observe + Propose
  double verify_seconds = 0;   // target forward + verification + KV commit
  double forward_seconds = 0;  // the target forward alone
  // Attention work of the forward: sum over sequences of new rows x context after the step.
  double attention = 0;
  // Of `attention`, the prompt chunks' (prefilling sequences').
  double prefill_attention = 0;
  // Each drafter's Observe (catch-up) + Propose this step, as one call.
  std::vector<DrafterCall> drafter_calls;
};

// KV blocks a request holds at most: its prompt and every generated token, plus one step's pending
// token and draft tree, but never more than the context length's positions (no forward goes past
// it). The engine admits a request only while the sum over running requests fits the cache; a
// router that plans admissions (services/router) uses the same rule.
inline int64_t KvBlocksReserved(const SpecRequest& request, int64_t block_size,
                                int64_t context_length) {
  const int64_t draft = request.speculation.enabled() ? request.speculation.max_draft_tokens : 0;
  const int64_t positions = static_cast<int64_t>(request.generation.prompt.size()) +
                            request.generation.max_new_tokens + draft + 1;
  return (std::min(positions, context_length) + block_size - 1) / block_size;
}

// Largest per-step draft (tree nodes) a request may ask for.
inline constexpr int32_t kMaxDraftTokens = 256;

// Default of SpecEngineOptions::max_step_tokens (docs/BENCHMARKS.md: chunked prefill).
inline constexpr int64_t kDefaultMaxStepTokens = 256;

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
  int64_t max_step_tokens = 0;  // tokens in one step's forward (0: unknown)
  std::string dtype;            // of the target's weights and hidden states
  std::string device;           // e.g. "cpu", "cuda:0"
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
    double min_reach = 0;          // DraftRequest::min_reach for its drafts, in [0, 1]
    double depth_reach = 0;        // DraftRequest::depth_reach for its drafts, at least 0
    // Steps from this one on (it included) the router promises this sequence no draft budget
    // (BudgetDecision::quiet_steps), at least 0: the engine need not keep its drafter's hidden
    // states of steps its drafter will not read (SpecEngine::SetDraftBudget).
    int32_t quiet_steps = 0;
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

}  // namespace specula
