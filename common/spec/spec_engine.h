// The speculative decoding loop over a continuously changing batch of sequences.
//
// Each Step() is one target forward: every running sequence verifies the candidate tree its
// drafter proposed (or decodes one token when speculation is off for it), and admitted prompts are
// prefilled in chunks with the rest of the step's token budget (max_step_tokens), all packed into
// one ForwardBatch. Sequences join and finish independently and
// each accepts a different number of tokens per step; the target's KV cache keeps exactly the
// accepted path. Single-threaded: one caller drives Submit/Cancel/Step (the router's loop).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/engine/plain_decoder.h"
#include "common/model/model_runner.h"
#include "common/spec/drafter.h"
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
  double mean_accepted_len() const;
};

struct RequestUpdate {
  RequestId id = 0;
  std::vector<int32_t> new_tokens;  // generated this step (after stop/length truncation)
  bool finished = false;
  std::string finish_reason;  // "stop", "length", "cancelled", "error"
  Status error;               // set when finish_reason is "error"
  SpecRequestStats stats;     // running totals
};

struct StepReport {
  std::vector<RequestUpdate> updates;
  int32_t batch_size = 0;      // sequences in the target forward
  int64_t prefill_tokens = 0;  // prompt tokens (chunks) prefilled this step
  int64_t verify_tokens = 0;   // pending + tree tokens of running sequences
  double draft_seconds = 0;    // drafter Observe + Propose
  double verify_seconds = 0;   // target forward + verification + KV commit
};

// KV blocks a request holds at most: its prompt and every generated token, plus one step's pending
// token and draft tree, but never more than the context length's positions (no forward goes past
// it). The engine admits a request only while the sum over running requests fits the cache; a
// router that plans admissions (services/router) uses the same rule.
int64_t KvBlocksReserved(const SpecRequest& request, int64_t block_size, int64_t context_length);

// Largest per-step draft (tree nodes) a request may ask for.
inline constexpr int32_t kMaxDraftTokens = 256;

// Default of SpecEngineOptions::max_step_tokens (docs/BENCHMARKS.md: chunked prefill).
inline constexpr int64_t kDefaultMaxStepTokens = 256;

struct SpecEngineOptions {
  int32_t max_batch_size = 64;  // running sequences
  // Tokens in one step's target forward (chunked prefill): the decoding sequences' pending tokens
  // and draft trees first, then chunks of the prompts being prefilled fill what is left, so a
  // long prompt is prefilled over several steps while the running sequences keep decoding. At
  // least one prompt token progresses per step. Values below 1 count as 1.
  int64_t max_step_tokens = kDefaultMaxStepTokens;
};

class SpecEngine {
 public:
  // `target` must outlive the engine and is used by nothing else while the engine runs.
  SpecEngine(ModelRunner* target, SpecEngineOptions options = {});
  ~SpecEngine();

  // ALREADY_EXISTS for a duplicate name; INVALID_ARGUMENT if it asks for hidden layers the target
  // does not have.
  Status AddDrafter(std::unique_ptr<Drafter> drafter);
  std::vector<std::string> drafter_names() const;
  const ModelRunner& target() const { return *target_; }
  const SpecEngineOptions& options() const { return options_; }
  Drafter* drafter(const std::string& name) const;
  // Bytes of per-sequence state all drafters hold now.
  int64_t DrafterStateBytes() const;

  // INVALID_ARGUMENT naming the field (request fields, drafter name, draft budget, verification
  // parameters); OUT_OF_RANGE past the context; RESOURCE_EXHAUSTED if it could never fit the KV
  // cache.
  Status Validate(const SpecRequest& request) const;
  // Validates and queues the request.
  StatusOr<RequestId> Submit(SpecRequest request);
  // Finishes the request with reason "cancelled" in the next report and frees its KV blocks.
  // NOT_FOUND if unknown or already finished.
  Status Cancel(RequestId id);
  // The step plan's per-sequence draft budget: tree nodes for the request's next steps, clamped to
  // [0, the request's max_draft_tokens] (the KV reservation is sized for that). 0 = no draft.
  // NOT_FOUND if unknown or finished.
  Status SetDraftBudget(RequestId id, int32_t max_draft_tokens);

  // Runs one step. Per-request failures (a drafter error, an invalid tree) degrade that request to
  // no speculation for the step and are counted in its stats. A target forward that fails because
  // of one sequence drops that sequence's draft (or ends that request with reason "error") and runs
  // again without it; an unattributable failure drops the drafts, then runs each sequence alone.
  // Exceptions (LibTorch, bad_alloc) become a Status of the requests affected.
  StatusOr<StepReport> Step();

  bool HasWork() const;
  int32_t num_running() const;
  int32_t num_waiting() const;

 private:
  struct Sequence;
  struct ForwardGroup;
  struct Observations;
  // The step, one verb each (in order).
  void RunStep(StepReport* report);
  void FinishCancelled(StepReport* report);
  void AdmitWaiting(StepReport* report);
  void Draft(const std::vector<Sequence*>& decoding);
  // Sets each prefilling sequence's chunk for the step; returns those with a non-empty one.
  std::vector<Sequence*> PlanChunks(const std::vector<Sequence*>& decoding,
                                    const std::vector<Sequence*>& prefilling);
  ForwardBatch Assemble(const std::vector<Sequence*>& members) const;
  // Runs the members' forward; a failure attributable to one sequence drops its draft or ends
  // it, and the rest run again. Returns the forwards that ran (usually one).
  std::vector<ForwardGroup> ForwardIsolating(std::vector<Sequence*> members, StepReport* report);
  void CommitGroup(ForwardGroup& group, StepReport* report, Observations* observations);
  // The KV commit of every accepted path of the group in one CommitPaths; on failure, one by one
  // so that only the failing sequences end.
  void FlushCommits(ForwardGroup& group, StepReport* report, Observations* observations);
  void ForgetObservation(Sequence* s, Observations* observations);
  // Per member of a forward: a prefill chunk or a verified tree, then stops, then what its drafter
  // observes.
  void CommitSequence(ForwardGroup& group, size_t b, const at::Tensor& logits, StepReport* report,
                      Observations* observations);
  // Keeps the chunk's hidden states; after the last chunk samples the first token (true).
  bool CommitPrefillChunk(ForwardGroup& group, size_t b, const float* rows, int64_t vocab,
                          std::vector<int32_t>* emitted);
  Status AcceptTree(ForwardGroup& group, size_t b, const float* rows, int64_t vocab,
                    std::vector<int32_t>* emitted, std::vector<int64_t>* hidden_rows);
  // Appends the emitted tokens up to the first stop; returns "stop", "length" or "".
  std::string ApplyStops(Sequence& s, std::vector<int32_t>* emitted);
  void QueueObservation(const ForwardGroup& group, size_t b, bool was_prefill,
                        const std::vector<int32_t>& emitted,
                        const std::vector<int64_t>& hidden_rows, Observations* observations);
  void ObserveAll(const Observations& observations);
  void DropDraft(Sequence& s, const Status& error);
  void Finish(Sequence& s, const std::string& reason, Status error, StepReport* report);

  ModelRunner* target_;
  SpecEngineOptions options_;
  std::map<std::string, std::unique_ptr<Drafter>> drafters_;
  std::map<RequestId, std::unique_ptr<Sequence>> sequences_;  // waiting and running
  std::vector<RequestId> waiting_;                            // FIFO
  std::vector<RequestId> cancelled_;
  RequestId next_id_ = 1;
  int64_t reserved_blocks_ = 0;
};

struct SpecGenerationResult {
  GenerationResult result;
  SpecRequestStats stats;
};

struct SpecRunStats {
  double seconds = 0;
  double draft_seconds = 0;
  double verify_seconds = 0;
  int64_t steps = 0;
  int64_t generated_tokens = 0;
  // The most bytes the engine's drafters held at once (after any step; Drafter::StateBytes).
  int64_t peak_drafter_state_bytes = 0;
};

// Submits every request, steps the engine until all finish, and returns results in request order.
// Validation errors name the request index; nothing runs then.
using SpecTokenCallback = std::function<void(size_t, const std::vector<int32_t>&)>;
StatusOr<std::vector<SpecGenerationResult>> GenerateAll(
    SpecEngine& engine, const std::vector<SpecRequest>& requests,
    const SpecTokenCallback& on_tokens = nullptr, SpecRunStats* stats = nullptr);

}  // namespace specula
