// The router's continuous batching: a background thread that plans every engine step and drives
// the target through a TargetBackend (in process for `--role all`, the Target service over gRPC
// for `--role router`), serving requests submitted from any thread.
//
// The loop thread repeatedly
//   1. takes newly submitted requests from a mutex-protected inbox into its FIFO queue (a request
//      that could never fit the target's KV cache ends here with RESOURCE_EXHAUSTED);
//   2. ends waiting requests whose handler cancelled them (client gone) or whose deadline passed,
//      and plans the cancellation of running ones (the target frees their KV blocks);
//   3. admits waiting requests in FIFO order while the batch has room (max_batch_size) and the
//      target's KV cache can hold each one's worst case (CapacityScheduler, the rule SpecEngine
//      applies too: KvBlocksReserved, no overtaking); the target's engine
//      prefills their prompts in chunks within its per-step token budget (max_step_tokens);
//      gives every running speculative request its draft budget for the step;
//   4. starts the step (TargetBackend::StartStep) and, while it runs, turns each request's new
//      tokens of the step before into a LoopEvent on its RequestChannel: incremental
//      detokenization (StreamDecoder), stop strings (StopStringMatcher; a match cancels the rest
//      of the request, from the step after next), and on the last event the finish reason, usage
//      and speculation stats;
//   5. publishes load (running, waiting, KV usage) and metrics;
//   6. waits for the step (TargetBackend::FinishStep), frees the batch slots and KV blocks of the
//      requests it finished and feeds it to the adaptive draft budget, so the next plan, made
//      right after, knows them;
// and sleeps on a condition variable when there is nothing to do (no polling). A step that fails
// (the target unreachable: UNAVAILABLE) ends every request the target held with that status;
// waiting requests stay queued for the next step, which reconnects.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/spec/budget_planner.h"
#include "common/spec/capacity_scheduler.h"
#include "common/spec/target_backend.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/status.h"
#include "services/router/metrics.h"
#include "services/router/request_channel.h"
#include "services/router/spec_decode_averages.h"

namespace specula::router {

using Clock = std::chrono::steady_clock;

// What the loop serves: the target (with its drafters) behind a backend, and the tokenizer.
struct ServedModel {
  std::string name;  // e.g. "pyllama-6m"
  std::string path;  // the model directory as given
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<TargetBackend> backend;
};

struct EngineLoopOptions {
  // Requests waiting or running at once (including those still in the inbox); beyond it Submit
  // returns RESOURCE_EXHAUSTED.
  int32_t max_queue = 256;
  // Sequences in one step's batch; at most the target's own limit.
  int32_t max_batch_size = 64;
  // Start each step before delivering the tokens of the one before, so that delivery runs beside
  // the target's step (on another process, or on the backend's own thread). false: deliver, then
  // plan and start the next step (a stop string then cancels from the very next step, not the one
  // after).
  bool overlap_steps = true;
  // Used for requests that leave the drafter empty: a drafter added to the engine, or "none".
  std::string default_drafter = "none";
  // Used for requests that leave max_draft_tokens at 0 (with the adaptive budget: their cap,
  // which their KV reservation is sized for).
  int32_t default_max_draft_tokens = 4;
  // Adaptive draft budget (common/spec/draft_budget.h): every step's per-sequence nodes come
  // from measured step costs and acceptance, up to each request's max_draft_tokens. false: every
  // step gives each request its max_draft_tokens. (`specula serve` turns it on by default.)
  bool adaptive_draft_budget = false;
  DraftBudgetOptions draft_budget;
  // Warm start of the step cost model (`specula bench-forward --json` points); may be empty.
  std::vector<std::pair<StepShape, double>> cost_profile;
  // Adaptive: each step's plan and measurement, one JSON line each (`--step-trace`); null: none.
  std::shared_ptr<StepTrace> step_trace;
  // Parameters of the lossy rules (specdec beta/tau, typical epsilon/delta) for requests that ask
  // for a lossy rule without giving them; `mode` is ignored (requests choose it).
  VerifyParams verify_defaults;
};

// Facts about the served model and configuration; fixed once the loop is created.
struct EngineInfo {
  std::string model_name;
  std::string model_path;
  std::string model_type;
  int32_t vocab_size = 0;
  int32_t context_length = 0;
  std::vector<int32_t> eos_token_ids;
  std::vector<std::string> drafters;  // besides "none"
  std::string default_drafter;
  int32_t default_max_draft_tokens = 0;
  bool adaptive_draft_budget = false;
  VerifyParams verify_defaults;  // mode is kLossless
  int32_t max_queue = 0;
  int32_t max_batch_size = 0;
  int64_t kv_cache_blocks = 0;
  int32_t kv_block_size = 0;
};

// A snapshot of the loop's load, published after every iteration.
struct LoadSnapshot {
  int32_t running = 0;    // in the engine's batch
  int32_t waiting = 0;    // accepted, not yet in the batch (inbox + engine queue)
  int32_t in_flight = 0;  // accepted and not yet finished (what max_queue limits)
  int64_t kv_cache_blocks_used = 0;
  int64_t kv_cache_blocks_total = 0;
};

// A request as the engine will run it: speculation defaults already resolved.
struct LoopRequest {
  std::string id;  // the client's request id, for the access log
  SpecRequest spec;
  std::vector<std::string> stop_strings;  // non-empty strings
  Clock::time_point deadline = Clock::time_point::max();
  Clock::time_point arrival = Clock::now();  // for latency metrics
};

class EngineLoop {
 public:
  // Starts the loop thread. INVALID_ARGUMENT for an unknown default drafter or a negative limit.
  // `metrics` (may be null) must outlive the loop.
  static StatusOr<std::unique_ptr<EngineLoop>> Create(ServedModel model, EngineLoopOptions options,
                                                      RouterMetrics* metrics = nullptr);
  // Shutdown(), then releases the engine and the model.
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Checks what can be checked without the engine's state (request fields, sampling, drafter
  // name, verification parameters: INVALID_ARGUMENT / OUT_OF_RANGE naming the field), then
  // queues the request: RESOURCE_EXHAUSTED when max_queue requests are in flight, UNAVAILABLE
  // after Shutdown. Thread-safe. The returned channel receives the request's events.
  // `on_event`, if given, becomes the channel's listener (RequestChannel::SetListener) before the
  // loop can push anything to it.
  StatusOr<std::shared_ptr<RequestChannel>> Submit(LoopRequest request,
                                                   std::function<void()> on_event = {});
  // Cancels the request of `channel` (the loop ends it with CANCELLED and frees its KV blocks).
  // Thread-safe; no-op for a finished request.
  void Cancel(RequestChannel& channel);

  // Refuses new requests (UNAVAILABLE) while those already accepted keep running. Idempotent.
  void StopAccepting();
  // Ends every request with UNAVAILABLE and stops the loop thread. Idempotent.
  void Shutdown();

  const EngineInfo& info() const { return info_; }
  const Tokenizer& tokenizer() const { return *model_.tokenizer; }
  LoadSnapshot load() const;

 private:
  struct Active;
  struct Pending {
    LoopRequest request;
    std::shared_ptr<RequestChannel> channel;
  };

  EngineLoop(ServedModel model, EngineLoopOptions options, RouterMetrics* metrics);
  void Run();
  void AdmitInbox(std::vector<Pending> incoming);
  void CheckCancellations();
  StepPlan PlanStep();
  // Finishes the step in flight, plans and starts the next, then delivers the finished one.
  void ProcessStep();
  // Frees the batch slots and KV blocks of the requests the step finished.
  void RetireFinished(const StepOutcome& outcome);
  // Turns the step's new tokens into events; ends the requests it finished.
  void DeliverStep(StepOutcome& outcome);
  // Waits out a step in flight whose outcome nobody will read (shutdown).
  void AbandonStepInFlight();
  // Delivers the request's last event (filling the totals) and stops counting it as in flight.
  void Deliver(Active& a, LoopEvent event);
  // Forgets a request the target no longer holds (or never held).
  void Erase(RequestId id);
  // Ends every admitted request with `status` (the target lost them, or shutdown); with
  // `include_waiting`, waiting ones too.
  void FailAll(const Status& status, bool include_waiting);
  // After an exception escaped a step: ends every admitted request with INTERNAL naming `what`
  // and plans their cancellation on the target; waiting requests stay queued.
  void RecoverFromException(std::string_view what);
  void PublishLoad();
  // Feeds the step to the adaptive budget (and the averages behind kappa and theta); `decided`
  // is the budget's decision for that step, `wall_seconds` what the step cost the loop.
  void Learn(const StepOutcome& outcome, const BudgetDecision& decided, double wall_seconds);
  // Publishes what the budget decided for the step and what it measured.
  void PublishBudget(const StepOutcome& outcome, const BudgetDecision& decision,
                     double wall_seconds);

  ServedModel model_;
  EngineLoopOptions options_;
  RouterMetrics* metrics_;
  EngineInfo info_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::vector<Pending> inbox_;  // guarded by mu_
  bool accepting_ = true;       // guarded by mu_
  bool stopping_ = false;       // guarded by mu_
  std::atomic<int32_t> in_flight_{0};

  // Loop thread only.
  int64_t vocab_size_ = 0;  // the target's, for request validation
  int64_t context_length_ = 0;
  std::map<RequestId, std::unique_ptr<Active>> active_;  // waiting and admitted
  // The waiting queue (FIFO) and the admitted batch with their KV block reservations.
  CapacityScheduler capacity_{CapacityLimits{}};
  std::vector<RequestId> to_cancel_;  // admitted; cancel in the next plan
  // The step the target is running (started, not yet finished), when it was started, and where
  // its cost is counted from (SecondsBetween(step_origin_, its end) is what the budget learns).
  bool step_in_flight_ = false;
  Clock::time_point step_started_{}, step_origin_{};
  RequestId next_id_ = 1;
  int64_t kv_blocks_used_now_ = 0;

  std::unique_ptr<BudgetPlanner> planner_;  // null: fixed budgets
  SpecDecodeAverages averages_;             // kappa, theta, draft share: for metrics

  std::atomic<int32_t> running_{0};
  std::atomic<int32_t> waiting_count_{0};
  std::atomic<int64_t> kv_blocks_used_{0};

  std::thread thread_;
};

}  // namespace specula::router
