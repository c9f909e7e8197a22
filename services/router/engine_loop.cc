#include "services/router/engine_loop.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "common/tokenizer/stream_decoder.h"
#include "common/util/log.h"
#include "services/router/server_log.h"
#include "services/router/stop_strings.h"

namespace specula::router {
namespace {

double SecondsBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

// A request the engine knows about (loop thread only).
struct EngineLoop::Active {
  Active(const Tokenizer& tokenizer, LoopRequest r, std::shared_ptr<RequestChannel> c)
      : request(std::move(r)),
        channel(std::move(c)),
        decoder(tokenizer, /*skip_special_tokens=*/true),
        stops(request.stop_strings),
        last_delivery(request.arrival) {}

  LoopRequest request;
  std::shared_ptr<RequestChannel> channel;
  StreamDecoder decoder;
  StopStringMatcher stops;
  Clock::time_point last_delivery;
  Clock::time_point admitted_at, first_token_at;  // for the per-request metrics and log
  bool first_token_delivered = false;
  int64_t completion_tokens = 0;
  SpecRequestStats stats;  // the engine's running totals so far
  // Status to report once the engine confirms a cancellation we asked for.
  Status cancel_status;
  bool cancelling = false;
  // The last event is delivered (a stop string matched); the target still has to drop the request.
  bool delivered = false;
  bool admitted = false;  // in the target's batch
};

StatusOr<std::unique_ptr<EngineLoop>> EngineLoop::Create(ServedModel model,
                                                         EngineLoopOptions options,
                                                         RouterMetrics* metrics) {
  if (!model.tokenizer || !model.backend) {
    return InvalidArgumentError("the served model needs a tokenizer and a target backend");
  }
  if (options.max_queue < 1) {
    return InvalidArgumentError(StrCat("max_queue must be at least 1, got ", options.max_queue));
  }
  if (options.default_max_draft_tokens < 0) {
    return InvalidArgumentError(
        StrCat("the default draft length must be >= 0, got ", options.default_max_draft_tokens));
  }
  options.verify_defaults.mode = VerifyMode::kLossless;
  RETURN_IF_ERROR(options.verify_defaults.Validate());
  if (options.max_batch_size < 1) {
    return InvalidArgumentError(
        StrCat("max_batch_size must be at least 1, got ", options.max_batch_size));
  }
  const TargetInfo target = model.backend->info();
  if (target.max_batch_size > 0) {
    options.max_batch_size = std::min(options.max_batch_size, target.max_batch_size);
  }
  if (options.default_drafter.empty()) options.default_drafter = "none";
  if (options.default_drafter != "none" &&
      std::find(target.drafters.begin(), target.drafters.end(), options.default_drafter) ==
          target.drafters.end()) {
    std::string known = "none";
    for (const std::string& d : target.drafters) known += ", " + d;
    return InvalidArgumentError(StrCat("default drafter '", options.default_drafter,
                                       "' is not loaded (loaded: ", known, ")"));
  }
  return std::unique_ptr<EngineLoop>(new EngineLoop(std::move(model), std::move(options), metrics));
}

EngineLoop::EngineLoop(ServedModel model, EngineLoopOptions options, RouterMetrics* metrics)
    : model_(std::move(model)), options_(std::move(options)), metrics_(metrics) {
  const TargetInfo target = model_.backend->info();
  info_.model_name = model_.name;
  info_.model_path = model_.path;
  info_.model_type = target.model_type;
  info_.vocab_size = target.vocab_size;
  info_.context_length = target.context_length;
  info_.eos_token_ids = target.eos_token_ids;
  info_.drafters = target.drafters;
  info_.default_drafter = options_.default_drafter;
  info_.default_max_draft_tokens = options_.default_max_draft_tokens;
  info_.adaptive_draft_budget = options_.adaptive_draft_budget;
  if (options_.adaptive_draft_budget) {
    planner_ = std::make_unique<BudgetPlanner>(options_.draft_budget, target.max_step_tokens);
    planner_->policy().target_cost().WarmStart(options_.cost_profile);
    if (options_.step_trace) planner_->SetTrace(options_.step_trace.get(), "router");
  }
  info_.verify_defaults = options_.verify_defaults;
  info_.max_queue = options_.max_queue;
  info_.max_batch_size = options_.max_batch_size;
  info_.kv_cache_blocks = target.kv_cache_blocks;
  info_.kv_block_size = target.kv_block_size;
  capacity_ = CapacityScheduler({.max_batch_size = options_.max_batch_size,
                                 .kv_cache_blocks = target.kv_cache_blocks,
                                 .kv_block_size = target.kv_block_size,
                                 .context_length = target.context_length});
  vocab_size_ = target.vocab_size;
  context_length_ = target.context_length;
  if (metrics_) metrics_->DeclareDraftPositions(std::max(options_.default_max_draft_tokens, 1));
  PublishLoad();
  thread_ = std::thread([this] { Run(); });
}

EngineLoop::~EngineLoop() { Shutdown(); }

StatusOr<std::shared_ptr<RequestChannel>> EngineLoop::Submit(LoopRequest request,
                                                             std::function<void()> on_event) {
  // Everything here is a pure function of the request and fixed facts, so it is safe on the
  // caller's thread while the loop thread drives the engine.
  const SpecRequest& spec = request.spec;
  RETURN_IF_ERROR(ValidateGenerationRequest(spec.generation, vocab_size_, context_length_));
  if (spec.speculation.max_draft_tokens < 0 ||
      spec.speculation.max_draft_tokens > kMaxDraftTokens) {
    return InvalidArgumentError(StrCat("speculation.max_draft_tokens must be in [0, ",
                                       kMaxDraftTokens, "], got ",
                                       spec.speculation.max_draft_tokens));
  }
  const std::string& drafter = spec.speculation.drafter;
  if (!drafter.empty() && drafter != "none" &&
      std::find(info_.drafters.begin(), info_.drafters.end(), drafter) == info_.drafters.end()) {
    std::string known = "none";
    for (const std::string& d : info_.drafters) known += ", " + d;
    return InvalidArgumentError(StrCat("unknown drafter '", drafter, "' (available: ", known, ")"));
  }
  RETURN_IF_ERROR(spec.speculation.verify.Validate());
  for (size_t i = 0; i < request.stop_strings.size(); ++i) {
    if (request.stop_strings[i].empty()) {
      return InvalidArgumentError(StrCat("stop[", i, "] is empty"));
    }
  }
  auto channel = std::make_shared<RequestChannel>();
  if (on_event) channel->SetListener(std::move(on_event));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || !accepting_) return UnavailableError("the server is shutting down");
    if (in_flight_.load() >= options_.max_queue) {
      return ResourceExhaustedError(StrCat("the server's queue is full: ", options_.max_queue,
                                           " requests are waiting or running (max_queue)"));
    }
    in_flight_.fetch_add(1);
    inbox_.push_back({std::move(request), channel});
  }
  wake_.notify_one();
  return channel;
}

void EngineLoop::Cancel(RequestChannel& channel) {
  channel.RequestCancel();
  // Taking the lock orders the flag before the loop's next wait, so the wake-up is never lost.
  { std::lock_guard<std::mutex> lock(mu_); }
  wake_.notify_one();
}

void EngineLoop::StopAccepting() {
  std::lock_guard<std::mutex> lock(mu_);
  accepting_ = false;
}

void EngineLoop::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

LoadSnapshot EngineLoop::load() const {
  LoadSnapshot s;
  s.running = running_.load();
  s.waiting = waiting_count_.load();
  s.in_flight = in_flight_.load();
  s.kv_cache_blocks_used = kv_blocks_used_.load();
  s.kv_cache_blocks_total = info_.kv_cache_blocks;
  return s;
}

void EngineLoop::Run() {
  while (true) {
    std::vector<Pending> incoming;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // active_, to_cancel_ and step_in_flight_ are the loop thread's own; reading them here is
      // safe.
      wake_.wait(lock, [&] {
        return stopping_ || step_in_flight_ || !inbox_.empty() || !active_.empty() ||
               !to_cancel_.empty();
      });
      if (stopping_) {
        incoming.swap(inbox_);
        lock.unlock();
        AbandonStepInFlight();
        const Status down = UnavailableError("the server is shutting down");
        for (Pending& p : incoming) {
          Active a(*model_.tokenizer, std::move(p.request), std::move(p.channel));
          Deliver(a, {.finish_reason = FinishReason::kCancelled, .status = down});
        }
        FailAll(down, /*include_waiting=*/true);
        PublishLoad();
        return;
      }
      incoming.swap(inbox_);
    }
    // The last resort of failure isolation: whatever escapes a step (an exception from the
    // backend, a codec, an allocation) ends the requests the step held, never the loop thread.
    try {
      AdmitInbox(std::move(incoming));
      CheckCancellations();
      ProcessStep();
    } catch (const std::exception& e) {
      RecoverFromException(e.what());
    } catch (...) {
      RecoverFromException("unknown exception");
    }
    PublishLoad();
  }
}

void EngineLoop::AbandonStepInFlight() {
  if (!step_in_flight_) return;
  step_in_flight_ = false;
  // Its requests end with the caller's status; the step itself must not outlive the loop.
  try {
    (void)model_.backend->FinishStep();
  } catch (...) {
  }
}

void EngineLoop::RecoverFromException(std::string_view what) {
  // c10::Error's message carries a backtrace after its first line.
  const std::string cause(what.substr(0, what.find('\n')));
  const Status error = InternalError(StrCat("engine step failed: ", cause));
  LogError(StrCat("engine loop: ", error.message(), "; failing the step's requests"));
  std::vector<RequestId> failed;
  for (auto& [id, a] : active_) {
    if (!a->admitted) continue;  // still queued: it never reached the target
    if (!a->delivered) Deliver(*a, {.finish_reason = FinishReason::kError, .status = error});
    failed.push_back(id);
  }
  for (RequestId id : failed) {
    Erase(id);
    // The target may still hold it: the next plan frees its KV blocks (an unknown id is ignored).
    if (std::find(to_cancel_.begin(), to_cancel_.end(), id) == to_cancel_.end()) {
      to_cancel_.push_back(id);
    }
  }
}

void EngineLoop::AdmitInbox(std::vector<Pending> incoming) {
  for (Pending& p : incoming) {
    auto a =
        std::make_unique<Active>(*model_.tokenizer, std::move(p.request), std::move(p.channel));
    a->stats.lossy =
        a->request.spec.speculation.enabled() && a->request.spec.speculation.verify.lossy();
    if (a->channel->cancel_requested()) {
      Deliver(*a, {.finish_reason = FinishReason::kCancelled,
                   .status = CancelledError("the request was cancelled")});
      continue;
    }
    if (Status fits = capacity_.Enqueue(next_id_, a->request.spec); !fits.ok()) {
      Deliver(*a, {.finish_reason = FinishReason::kError, .status = fits});  // never fits the cache
      continue;
    }
    active_[next_id_++] = std::move(a);
  }
}

void EngineLoop::CheckCancellations() {
  const Clock::time_point now = Clock::now();
  std::vector<RequestId> ended;
  for (auto& [id, a] : active_) {
    if (a->cancelling || a->delivered) continue;
    if (a->channel->cancel_requested()) {
      a->cancel_status = CancelledError("the request was cancelled");
    } else if (now >= a->request.deadline) {
      a->cancel_status = DeadlineExceededError("the request's deadline passed");
    } else {
      continue;
    }
    if (a->admitted) {
      a->cancelling = true;
      to_cancel_.push_back(id);
    } else {  // never reached the target
      Deliver(*a, {.finish_reason = FinishReason::kCancelled, .status = a->cancel_status});
      ended.push_back(id);
    }
  }
  for (RequestId id : ended) Erase(id);
}

StepPlan EngineLoop::PlanStep() {
  StepPlan plan;
  plan.cancel.swap(to_cancel_);
  // Admission needs batch room and the worst-case KV blocks (CapacityScheduler, the engine's rule:
  // FIFO, no overtaking); prompt tokens are budgeted by the target's engine, which prefills
  // prompts in chunks (SpecEngineOptions::max_step_tokens), so the router does not budget them
  // again.
  while (const std::optional<RequestId> id = capacity_.NextAdmissible()) {
    auto it = active_.find(*id);
    if (it == active_.end()) {  // cannot happen (Erase releases); never abort the server for it
      (void)capacity_.Release(*id);
      continue;
    }
    Active& a = *it->second;
    const int64_t prompt = static_cast<int64_t>(a.request.spec.generation.prompt.size());
    plan.admit.push_back({.id = *id, .request = a.request.spec});
    if (planner_) planner_->Admit(*id, a.request.spec);
    (void)capacity_.Admit(*id);  // cannot fail: the admissible head
    a.admitted = true;
    a.admitted_at = Clock::now();
    if (metrics_) metrics_->Admitted(prompt, a.stats.lossy);
  }
  // The draft budget is per sequence and per step: the adaptive policy's, or each request's own
  // draft length.
  if (planner_) {
    for (const StepPlan::DraftBudget& b : planner_->Plan()) {
      auto it = active_.find(b.id);
      if (it != active_.end() && !it->second->cancelling) plan.budgets.push_back(b);
    }
    return plan;
  }
  for (const auto& [id, a] : active_) {
    const SpeculationSettings& spec = a->request.spec.speculation;
    if (a->admitted && !a->cancelling && spec.enabled()) {
      plan.budgets.push_back({.id = id, .max_draft_tokens = spec.max_draft_tokens});
    }
  }
  return plan;
}

void EngineLoop::Erase(RequestId id) {
  auto it = active_.find(id);
  if (it == active_.end()) return;
  if (planner_) planner_->Forget(id);
  // Frees its batch slot and KV blocks, or takes it out of the queue (cancelled, deadline,
  // shutdown while waiting: PlanStep looks up every queued id in active_).
  (void)capacity_.Release(id);
  active_.erase(it);
}

void EngineLoop::ProcessStep() {
  // The step in flight ends first; the next one is planned from its outcome (finished requests
  // free their batch slots and KV blocks, the draft budget learns) and started before this
  // one's tokens are delivered, so detokenization, stop strings and streaming run beside the
  // target's next step rather than between the two.
  std::optional<StepOutcome> done;
  BudgetDecision decided;
  double done_wall_seconds = 0;
  Clock::time_point ready{};
  if (step_in_flight_) {
    step_in_flight_ = false;
    auto outcome = model_.backend->FinishStep();
    ready = Clock::now();
    if (!outcome.ok()) {
      // The step did not run: the target lost every admitted request (or never got this plan's).
      FailAll(outcome.status().WithContext("engine step"), /*include_waiting=*/false);
      return;
    }
    done = std::move(*outcome);
    kv_blocks_used_now_ = done->kv_blocks_used;
    // A step's cost is what it kept the target from the next one: from the previous step's end
    // when they ran back to back (this step's planning included), else from its planning.
    done_wall_seconds = SecondsBetween(step_origin_, ready);
    if (metrics_) metrics_->StepTimed(SecondsBetween(step_started_, ready), done->step_seconds);
    if (planner_) decided = planner_->last_decision();
    RetireFinished(*done);
    Learn(*done, decided, done_wall_seconds);
  }

  if (done && !options_.overlap_steps) {
    DeliverStep(*done);
    PublishBudget(*done, decided, done_wall_seconds);
  }
  if (!active_.empty() || !to_cancel_.empty()) {
    const Clock::time_point planned = Clock::now();
    StepPlan plan = PlanStep();
    if (capacity_.num_running() > 0 || !plan.empty()) {
      step_origin_ = done ? ready : planned;
      step_started_ = Clock::now();
      model_.backend->StartStep(std::move(plan));
      step_in_flight_ = true;
    }
  }
  if (done && options_.overlap_steps) {
    DeliverStep(*done);
    PublishBudget(*done, decided, done_wall_seconds);
  }
}

void EngineLoop::RetireFinished(const StepOutcome& outcome) {
  // Only what the next plan needs: their batch slots and KV blocks (and the budget's entries,
  // which the planner drops as it learns the step). Their events go out in DeliverStep.
  for (const RequestUpdate& u : outcome.report.updates) {
    if (u.finished) (void)capacity_.Release(u.id);
  }
}

void EngineLoop::DeliverStep(StepOutcome& outcome) {
  if (metrics_) {
    int64_t tokens = outcome.report.prefill_tokens;
    for (const RequestUpdate& u : outcome.report.updates) tokens += u.new_tokens.size();
    metrics_->IterationTokens(tokens);
  }
  PublishLoad();  // before any event, so a client that saw tokens sees their KV blocks in load()
  const Clock::time_point now = Clock::now();
  for (RequestUpdate& u : outcome.report.updates) {
    auto it = active_.find(u.id);
    if (it == active_.end()) continue;
    Active& a = *it->second;
    if (metrics_) metrics_->SpecProgress(a.stats, u.stats);
    a.stats = u.stats;
    if (a.delivered) {  // ended by a stop string; the target has now dropped it too
      if (u.finished) Erase(u.id);
      continue;
    }

    LoopEvent event;
    for (int32_t token : u.new_tokens) {
      event.token_ids.push_back(token);
      // Ids the tokenizer does not know (a model vocabulary padded past the tokenizer's) have no
      // text.
      auto piece = a.decoder.Push(token);
      if (piece.ok()) event.text += a.stops.Push(*piece);
      if (a.stops.matched()) break;
    }
    if (!event.token_ids.empty()) {
      a.completion_tokens += static_cast<int64_t>(event.token_ids.size());
      if (metrics_) {
        metrics_->TokensDelivered(static_cast<int64_t>(event.token_ids.size()),
                                  !a.first_token_delivered, SecondsBetween(a.last_delivery, now));
      }
      if (!a.first_token_delivered) a.first_token_at = now;
      a.first_token_delivered = true;
      a.last_delivery = now;
    }
    if (!a.stops.matched() && u.finished &&
        (u.finish_reason == FinishReason::kStop || u.finish_reason == FinishReason::kLength)) {
      event.text += a.stops.Push(a.decoder.Flush());
      if (!a.stops.matched()) event.text += a.stops.Flush();
    }

    if (a.stops.matched()) {
      event.finish_reason = FinishReason::kStopString;
      event.stop_string = a.stops.matched_stop();
      Deliver(a, std::move(event));
      if (u.finished) {
        Erase(u.id);
      } else {
        a.cancelling = true;
        to_cancel_.push_back(u.id);
      }
      continue;
    }
    if (!u.finished) {
      if (!event.token_ids.empty() || !event.text.empty()) a.channel->Push(std::move(event));
      continue;
    }
    switch (u.finish_reason) {
      case FinishReason::kStop:
      case FinishReason::kLength:
        event.finish_reason = u.finish_reason;
        break;
      case FinishReason::kCancelled:
        event.finish_reason = FinishReason::kCancelled;
        event.status =
            a.cancel_status.ok() ? CancelledError("the request was cancelled") : a.cancel_status;
        break;
      case FinishReason::kError:
      case FinishReason::kStopString:  // stop strings are the router's; the engine never ends one
        event.finish_reason = FinishReason::kError;
        event.status =
            u.error.ok()
                ? InternalError(StrCat("the engine ended the request with '", u.finish_reason, "'"))
                : u.error;
        break;
    }
    Deliver(a, std::move(event));
    Erase(u.id);
  }
}

void EngineLoop::Learn(const StepOutcome& outcome, const BudgetDecision& decided,
                       double wall_seconds) {
  averages_.AddStep(outcome.report, decided.predicted_speedup(), wall_seconds);
  if (planner_) planner_->OnStep(outcome.report, wall_seconds);
}

void EngineLoop::PublishBudget(const StepOutcome& outcome, const BudgetDecision& decision,
                               double wall_seconds) {
  if (!planner_ || !metrics_) return;
  const StepReport& r = outcome.report;
  BudgetSnapshot snapshot{.budgets = decision.budgets,
                          .predicted_seconds = decision.predicted_seconds,
                          .measured_seconds = wall_seconds,
                          .predicted_speedup = decision.predicted_speedup(),
                          .row_price = decision.min_reach,
                          .kappa = averages_.kappa(),
                          .theta = averages_.theta(),
                          .draft_share = averages_.draft_share()};
  const DraftingAudit& audit = planner_->policy().audit();
  snapshot.realized_speedup = audit.realized_speedup();
  snapshot.drafting_verdict = audit.verdict() == DraftingAudit::Verdict::kPays         ? 1
                              : audit.verdict() == DraftingAudit::Verdict::kDoesNotPay ? 0
                                                                                       : -1;
  snapshot.spare_tokens = planner_->policy().SpareTokens(
      {.tokens = r.prefill_tokens + r.verify_tokens, .attention = r.attention});
  const StepGapTail& gaps = planner_->policy().gap_tail();
  snapshot.gap_p99_seconds = gaps.plain_quantile();
  snapshot.overrun_p999_seconds = gaps.residual_quantile();
  for (const std::string& drafter : info_.drafters) {
    std::vector<double> p, supply;
    for (int32_t d = 1; d <= std::max(info_.default_max_draft_tokens, 1); ++d) {
      p.push_back(planner_->policy().acceptance().DrafterConditional(drafter, d));
      supply.push_back(planner_->policy().acceptance().DrafterSupply(drafter, d));
    }
    snapshot.acceptance.push_back({drafter, std::move(p)});
    snapshot.supply.push_back({drafter, std::move(supply)});
    using Streak = AcceptanceModel::Streak;
    for (auto [streak, name] :
         {std::pair{Streak::kFull, "full"}, std::pair{Streak::kPartial, "partial"},
          std::pair{Streak::kRejected, "rejected"}}) {
      snapshot.streak_shift.push_back(
          {.drafter = drafter,
           .streak = name,
           .shift = planner_->policy().acceptance().StreakShifts(
               drafter, streak, std::max(info_.default_max_draft_tokens, 1))});
    }
  }
  metrics_->DraftBudget(snapshot);
}

void EngineLoop::Deliver(Active& a, LoopEvent event) {
  event.finished = true;
  event.prompt_tokens = static_cast<int64_t>(a.request.spec.generation.prompt.size());
  event.completion_tokens = a.completion_tokens;
  event.stats = a.stats;
  const Clock::time_point now = Clock::now();
  const SpeculationSettings& spec = a.request.spec.speculation;
  FinishedRequest done{
      .id = a.request.id,
      .reason = event.finish_reason,
      .status = event.status,
      .drafter = spec.enabled() ? spec.drafter : "none",
      .prompt_tokens = event.prompt_tokens,
      .completion_tokens = a.completion_tokens,
      .max_tokens = a.request.spec.generation.max_new_tokens,
      .admitted = a.admitted,
      .queue_seconds = SecondsBetween(a.request.arrival, a.admitted ? a.admitted_at : now),
      .e2e_seconds = SecondsBetween(a.request.arrival, now),
      .stats = a.stats};
  if (a.admitted) {
    const Clock::time_point first = a.first_token_delivered ? a.first_token_at : now;
    const Clock::time_point last = a.first_token_delivered ? a.last_delivery : now;
    done.prefill_seconds = SecondsBetween(a.admitted_at, first);
    done.decode_seconds = SecondsBetween(first, last);
    done.inference_seconds = SecondsBetween(a.admitted_at, last);
  }
  if (a.first_token_delivered)
    done.ttft_seconds = SecondsBetween(a.request.arrival, a.first_token_at);
  if (metrics_) metrics_->Finished(done);
  if (LogEnabled(LogLevel::kInfo)) LogInfo(AccessLogLine(done));
  a.delivered = true;
  a.channel->Push(std::move(event));
  in_flight_.fetch_sub(1);
}

void EngineLoop::FailAll(const Status& status, bool include_waiting) {
  const FinishReason reason =
      status.code() == StatusCode::kUnavailable ? FinishReason::kCancelled : FinishReason::kError;
  std::vector<RequestId> failed;
  for (auto& [id, a] : active_) {
    if (!a->admitted && !include_waiting) continue;
    if (!a->delivered) Deliver(*a, {.finish_reason = reason, .status = status});
    failed.push_back(id);
  }
  for (RequestId id : failed) Erase(id);
  to_cancel_.clear();
  if (capacity_.num_running() == 0) kv_blocks_used_now_ = 0;
}

void EngineLoop::PublishLoad() {
  int32_t inbox = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox = static_cast<int32_t>(inbox_.size());
  }
  running_.store(capacity_.num_running());
  waiting_count_.store(capacity_.num_waiting() + inbox);
  kv_blocks_used_.store(kv_blocks_used_now_);
  if (metrics_) {
    metrics_->SetLoad(running_.load(), waiting_count_.load(),
                      info_.kv_cache_blocks > 0 ? static_cast<double>(kv_blocks_used_now_) /
                                                      static_cast<double>(info_.kv_cache_blocks)
                                                : 0.0);
  }
}

}  // namespace specula::router
