#include "common/spec/local_target_backend.h"

#include <chrono>
#include <exception>
#include <set>
#include <utility>

namespace specula {

LocalTargetBackend::LocalTargetBackend(std::unique_ptr<ModelRunner> target,
                                       SpecEngineOptions options, bool step_thread)
    : target_(std::move(target)), engine_(std::make_unique<SpecEngine>(target_.get(), options)) {
  if (step_thread) thread_ = std::thread([this] { StepThread(); });
}

LocalTargetBackend::~LocalTargetBackend() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();  // after the step in flight, if any
  }
  engine_.reset();  // releases its sequences from the target before the target goes
}

void LocalTargetBackend::StartStep(StepPlan plan) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    plan_ = std::move(plan);
    outcome_.reset();
    thrown_ = nullptr;
  }
  if (thread_.joinable()) changed_.notify_all();
}

StatusOr<StepOutcome> LocalTargetBackend::FinishStep() {
  if (!thread_.joinable()) {
    if (!plan_) return FailedPreconditionError("FinishStep without a step started");
    const StepPlan plan = std::move(*plan_);
    plan_.reset();
    return RunStep(plan);  // an exception leaves from here
  }
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return !plan_ || outcome_.has_value() || thrown_; });
  if (thrown_) {
    std::exception_ptr thrown = std::exchange(thrown_, nullptr);
    std::rethrow_exception(thrown);
  }
  if (!outcome_) return FailedPreconditionError("FinishStep without a step started");
  StatusOr<StepOutcome> outcome = std::move(*outcome_);
  outcome_.reset();
  return outcome;
}

void LocalTargetBackend::StepThread() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || plan_.has_value(); });
    if (!plan_) return;  // stopping, nothing in flight
    const StepPlan plan = std::move(*plan_);
    lock.unlock();
    std::optional<StatusOr<StepOutcome>> outcome;
    std::exception_ptr thrown;
    try {
      outcome.emplace(RunStep(plan));
    } catch (...) {
      thrown = std::current_exception();
    }
    lock.lock();
    plan_.reset();
    outcome_ = std::move(outcome);
    thrown_ = thrown;
    changed_.notify_all();
  }
}

TargetInfo LocalTargetBackend::info() const {
  const ModelConfig& config = target_->config();
  const KvCacheStats kv = target_->kv_stats();
  TargetInfo info;
  info.model_type = config.model_type;
  info.vocab_size = static_cast<int32_t>(config.vocab_size);
  info.context_length = static_cast<int32_t>(config.max_position_embeddings);
  info.eos_token_ids = config.eos_token_ids;
  info.drafters = engine_->drafter_names();
  info.kv_cache_blocks = kv.num_blocks;
  info.kv_block_size = static_cast<int32_t>(kv.block_size);
  info.max_batch_size = engine_->options().max_batch_size;
  info.max_step_tokens = engine_->options().max_step_tokens;
  info.dtype = target_->dtype_name();
  info.device = target_->device_name();
  return info;
}

StatusOr<StepOutcome> LocalTargetBackend::RunStep(const StepPlan& plan) {
  const auto t0 = std::chrono::steady_clock::now();
  std::set<RequestId> admitted;
  for (const StepPlan::Admission& a : plan.admit) {
    if (engine_ids_.count(a.id) || !admitted.insert(a.id).second) {
      return InvalidArgumentError(StrCat("plan.admit: request ", a.id, " is already running"));
    }
  }

  StepOutcome outcome;
  std::vector<RequestUpdate> refused;
  for (RequestId id : plan.cancel) {
    auto it = engine_ids_.find(id);
    if (it != engine_ids_.end()) (void)engine_->Cancel(it->second);
  }
  for (const StepPlan::Admission& a : plan.admit) {
    auto engine_id = engine_->Submit(a.request);
    if (!engine_id.ok()) {
      refused.push_back({.id = a.id,
                         .finished = true,
                         .finish_reason = FinishReason::kError,
                         .error = engine_id.status().WithContext(StrCat("request ", a.id))});
      continue;
    }
    engine_ids_[a.id] = *engine_id;
    router_ids_[*engine_id] = a.id;
  }
  for (const StepPlan::DraftBudget& b : plan.budgets) {
    auto it = engine_ids_.find(b.id);
    if (it != engine_ids_.end())
      (void)engine_->SetDraftBudget(it->second, b.max_draft_tokens, b.min_reach, b.depth_reach,
                                    b.quiet_steps);
  }

  ASSIGN_OR_RETURN(outcome.report, engine_->Step());
  for (RequestUpdate& u : outcome.report.updates) {
    auto it = router_ids_.find(u.id);
    if (it == router_ids_.end()) continue;  // cannot happen: every engine request came from a plan
    const RequestId router_id = it->second;
    if (u.finished) {
      engine_ids_.erase(router_id);
      router_ids_.erase(it);
    }
    u.id = router_id;
  }
  for (RequestUpdate& u : refused) outcome.report.updates.push_back(std::move(u));
  const KvCacheStats kv = target_->kv_stats();
  outcome.kv_blocks_used = kv.num_blocks - kv.free_blocks;
  outcome.step_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return outcome;
}

void LocalTargetBackend::CancelAll() {
  StepPlan plan;
  for (const auto& [router_id, engine_id] : engine_ids_) plan.cancel.push_back(router_id);
  // One step processes the cancellations before anything else; waiting requests never ran.
  while (!engine_ids_.empty()) {
    if (!Step(plan).ok()) break;
    plan = {};
    for (const auto& [router_id, engine_id] : engine_ids_) plan.cancel.push_back(router_id);
  }
  engine_ids_.clear();
  router_ids_.clear();
}

}  // namespace specula
