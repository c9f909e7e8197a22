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
#include <optional>
#include <string>
#include <vector>

#include "common/engine/plain_decoder.h"
#include "common/model/model_runner.h"
#include "common/spec/budget_planner.h"
#include "common/spec/capacity_scheduler.h"
#include "common/spec/drafter.h"
#include "common/spec/step_contract.h"
#include "common/spec/verifier.h"
#include "common/util/status.h"

namespace specula {

class HiddenRowStore;

// Where lossless verification runs (tensor_verifier.h). kAuto: on the logits tensor when it is on
// an accelerator (greedy copies back one int32 per row, sampling runs as tensor ops), on the host
// when the logits are already there (per-node loops over host rows are cheaper than dozens of
// small tensor ops on a CPU: docs/BENCHMARKS.md). Lossy rules and prefill always use the host.
enum class VerifyPlacement { kAuto, kHost, kTensors };
// "auto", "host", "tensors".
const char* VerifyPlacementName(VerifyPlacement placement);
StatusOr<VerifyPlacement> ParseVerifyPlacement(const std::string& name);

// SpecEngineOptions::drafter_context's default (measured in docs/BENCHMARKS.md).
inline constexpr int64_t kDefaultDrafterContext = 32;

struct SpecEngineOptions {
  int32_t max_batch_size = 64;  // running sequences
  // Tokens in one step's target forward (chunked prefill): the decoding sequences' pending tokens
  // and draft trees first, then chunks of the prompts being prefilled fill what is left, so a
  // long prompt is prefilled over several steps while the running sequences keep decoding. At
  // least one prompt token progresses per step. Values below 1 count as 1.
  int64_t max_step_tokens = kDefaultMaxStepTokens;
  // A sequence that does not draft defers its drafter's Observe (the budget left it at 0 nodes,
  // so the work may never be needed). Past this many deferred generated tokens a token-only
  // drafter catches up anyway, and a drafter of hidden states is detached from the sequence (its
  // deferred states are memory, and catching up would cost what not drafting saved).
  int64_t max_deferred_observation = 256;
  // The most recent tokens a drafter of hidden states catches up on (0 = all). A sequence whose
  // backlog is longer (a long prompt, a long run at 0 nodes) restarts its drafter from its last
  // drafter_context tokens and their states, as if they were the prompt, so a catch-up (and a
  // probe that pays one) costs at most that many rows, and what an idle sequence keeps for its
  // drafter is bounded (at most twice this many rows): such a sequence is never detached for
  // max_deferred_observation. Lossless either way; the drafter sees less context.
  int64_t drafter_context = kDefaultDrafterContext;
  VerifyPlacement verify_placement = VerifyPlacement::kAuto;
  // Where the hidden-state rows that drafters have not observed yet wait: false = per-sequence
  // host buffers when the target runs on the CPU (memcpy per sequence, the cheapest there), the
  // shared HiddenRowStore elsewhere (a few ops per step whatever the batch); true = the store on
  // the CPU as well (tests run a device's path with it).
  bool hidden_row_store_on_cpu = false;
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
  // Finishes the request with FinishReason::kCancelled in the next report and frees its KV blocks.
  // NOT_FOUND if unknown or already finished.
  Status Cancel(RequestId id);
  // The step plan's per-sequence draft budget: tree nodes for the request's next steps, clamped to
  // [0, the request's max_draft_tokens] (the KV reservation is sized for that). 0 = no draft.
  // NOT_FOUND if unknown or finished. min_reach: DraftRequest::min_reach for its drafts (clamped
  // to [0, 1]; 0 = every node the drafter proposes); depth_reach: DraftRequest::depth_reach (at
  // least 0; 0 = every depth within the budget). quiet_steps (with a budget of 0): the plan's
  // promise of no budget for this many steps, this one included (StepPlan::DraftBudget): a
  // drafter of hidden states with a bounded context (SpecEngineOptions::drafter_context) reads
  // only its last steps' states at its next draft, so the steps before those skip capturing and
  // keeping them (on the CPU at batch 1, ~1% of a step); its drafter then restarts from the
  // tokens after them. A budget given before the promise ends drafts from the shorter context.
  Status SetDraftBudget(RequestId id, int32_t max_draft_tokens, double min_reach = 0,
                        double depth_reach = 0, int32_t quiet_steps = 0);

  // Runs one step. Per-request failures (a drafter error, an invalid tree) degrade that request to
  // no speculation for the step and are counted in its stats; a drafter call that fails for a
  // batch is retried per sequence, so only the failing ones lose their drafts. A request whose
  // worst case does not fit its drafter's cache (Drafter::capacity) runs without speculation. A
  // target forward that fails because of one sequence drops that sequence's draft (or ends that
  // request with FinishReason::kError) and runs again without it; an unattributable failure drops
  // the drafts, then runs each sequence alone. Exceptions (LibTorch, bad_alloc) become a Status of
  // the requests affected.
  StatusOr<StepReport> Step();

  bool HasWork() const;
  int32_t num_running() const;
  int32_t num_waiting() const;

 private:
  struct Sequence;
  struct ForwardGroup;
  // The step, one verb each (in order).
  void RunStep(StepReport* report);
  void FinishCancelled(StepReport* report);
  void AdmitWaiting(StepReport* report);
  void Draft(const std::vector<Sequence*>& decoding, StepReport* report);
  // Catches the drafter up on what its sequences' steps committed (deferred while a sequence
  // does not draft), then proposes; one timed call per drafter.
  void DraftWith(Drafter* drafter, const std::vector<Sequence*>& members, StepReport* report);
  // Sets each prefilling sequence's chunk for the step; returns those with a non-empty one.
  std::vector<Sequence*> PlanChunks(const std::vector<Sequence*>& decoding,
                                    const std::vector<Sequence*>& prefilling);
  ForwardBatch Assemble(const std::vector<Sequence*>& members) const;
  // Whether this step neither captures nor keeps the sequence's hidden states: a decoding
  // sequence whose drafter reads at most drafter_context recent states, promised no budget for
  // longer than that (SetDraftBudget's quiet_steps).
  bool SkipsHiddenRows(const Sequence& s) const;
  // Runs the members' forward; a failure attributable to one sequence drops its draft or ends
  // it, and the rest run again. Returns the forwards that ran (usually one).
  std::vector<ForwardGroup> ForwardIsolating(std::vector<Sequence*> members, StepReport* report);
  void CommitGroup(ForwardGroup& group, StepReport* report);
  bool VerifiesOnTensors(const at::Tensor& logits) const;
  // Lossless verification of the group's decoding members on the logits tensor, in one batch.
  void VerifyOnTensors(ForwardGroup& group);
  // The KV commit of every accepted path of the group in one CommitPaths; on failure, one by one
  // so that only the failing sequences end.
  void FlushCommits(ForwardGroup& group, StepReport* report);
  // Whether the group's hidden-state rows go to the shared store (else per-sequence buffers).
  bool StoresHiddenRows(const ForwardGroup& group) const;
  // The hidden-state rows the group's members keep for their drafters, when they go to the
  // store: one upload and two ops per layer for the whole group (hidden_row_store.h). A member
  // whose rows cannot be kept goes on without speculation.
  void FlushHiddenRows(ForwardGroup& group);
  // Per member of a forward: a prefill chunk or a verified tree, then stops, then what its drafter
  // will observe. `rows`: the member's logits rows on the host (null when verified on the tensor).
  void CommitSequence(ForwardGroup& group, size_t b, const float* rows, int64_t vocab,
                      StepReport* report);
  // Keeps the chunk's hidden states; after the last chunk samples the first token (true).
  bool CommitPrefillChunk(ForwardGroup& group, size_t b, const float* rows, int64_t vocab,
                          std::vector<int32_t>* emitted);
  Status AcceptTree(ForwardGroup& group, size_t b, const float* rows, int64_t vocab,
                    std::vector<int32_t>* emitted, std::vector<int64_t>* hidden_rows);
  // Appends the emitted tokens up to the first stop; returns kStop, kLength or nothing.
  std::optional<FinishReason> ApplyStops(Sequence& s, std::vector<int32_t>* emitted);
  // Appends the committed tokens (and their hidden states) to what the drafter has not observed.
  void QueueObservation(ForwardGroup& group, size_t b, bool was_prefill,
                        const std::vector<int32_t>& emitted,
                        const std::vector<int64_t>& hidden_rows);
  // The most draft nodes the sequence can use next step (its cap, the context, max_new_tokens).
  int32_t DraftRoom(const Sequence& s) const;
  int32_t DraftRoomAt(const Sequence& s, int64_t context) const;
  // Reserves the sequence's worst case in the drafter's cache (Drafter::capacity) and adds it;
  // RESOURCE_EXHAUSTED when the cache cannot hold it, or the drafter's error.
  Status AttachDrafter(Sequence& s, Drafter* drafter);
  // Releases the sequence's drafter state and reservation (no-op without a drafter).
  void ReleaseDrafter(Sequence& s);
  // Speculation off for the rest of the request (its drafter's state is released).
  void Detach(Sequence& s);
  // Detach, counting `error` as the sequence's draft error.
  void DetachWithError(Sequence& s, const Status& error);
  // A drafter of hidden states whose backlog holds more than `keep` tokens (> 0), or that missed
  // states (SkipsHiddenRows), starts over from the last `keep` (SpecEngineOptions::
  // drafter_context) or what followed the missed ones: the backlog keeps only those, and a
  // drafter that observed the sequence before releases and re-adds it. The drafter's error from
  // AddSequence, if any.
  Status RestartFromRecent(Sequence& s, int64_t keep);
  // Past twice drafter_context unobserved tokens, RestartFromRecent now (what an idle sequence
  // holds stays bounded); detaches the sequence if its drafter cannot restart it.
  void BoundBacklog(Sequence& s);
  void DropDraft(Sequence& s, const Status& error);
  void Finish(Sequence& s, FinishReason reason, Status error, StepReport* report);

  ModelRunner* target_;
  SpecEngineOptions options_;
  std::map<std::string, std::unique_ptr<Drafter>> drafters_;
  // Declared before sequences_: their backlogs free their slots into it when destroyed.
  std::unique_ptr<HiddenRowStore> hidden_store_;
  std::map<RequestId, std::unique_ptr<Sequence>> sequences_;  // waiting and running
  CapacityScheduler capacity_;  // the waiting queue (FIFO), the running batch, their KV blocks
  std::vector<RequestId> cancelled_;
  RequestId next_id_ = 1;
  std::map<const Drafter*, int64_t> drafter_blocks_;  // reserved in each drafter's cache
};

struct SpecGenerationResult {
  GenerationResult result;
  SpecRequestStats stats;
};

struct SpecRunStats {
  double seconds = 0;
  double draft_seconds = 0;
  double verify_seconds = 0;
  double forward_seconds = 0;  // the target forwards alone (part of verify_seconds)
  int64_t steps = 0;
  int64_t generated_tokens = 0;
  // With a planner: draft nodes the policy gave, summed over steps and sequences, and the steps
  // it planned.
  int64_t budget_nodes = 0;
  int64_t budgeted_sequence_steps = 0;
  // The most bytes the engine's drafters held at once (after any step; Drafter::StateBytes).
  int64_t peak_drafter_state_bytes = 0;
  // The most tokens one step's target forward held (prompt chunks, pending tokens and drafts).
  int64_t peak_step_tokens = 0;
};

// Submits every request, steps the engine until all finish, and returns results in request order.
// Validation errors name the request index; nothing runs then.
// With a `planner`, every step's draft budgets come from the adaptive policy (each request's
// max_draft_tokens is its cap); without one each request drafts its own max_draft_tokens.
using SpecTokenCallback = std::function<void(size_t, const std::vector<int32_t>&)>;
StatusOr<std::vector<SpecGenerationResult>> GenerateAll(
    SpecEngine& engine, const std::vector<SpecRequest>& requests,
    const SpecTokenCallback& on_tokens = nullptr, SpecRunStats* stats = nullptr,
    BudgetPlanner* planner = nullptr);

}  // namespace specula
