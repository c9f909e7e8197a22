#include "common/spec/budget_planner.h"

#include <algorithm>

namespace specula {

BudgetPlanner::BudgetPlanner(DraftBudgetOptions options, int64_t max_step_tokens)
    : policy_(options), max_step_tokens_(max_step_tokens) {}

void BudgetPlanner::Admit(RequestId id, const SpecRequest& request) {
  Tracked t;
  if (request.speculation.enabled()) {
    t.drafter = request.speculation.drafter;
    t.cap = request.speculation.max_draft_tokens;
  }
  t.prompt = static_cast<int64_t>(request.generation.prompt.size());
  t.prefill_left = t.prompt;
  t.tokens_left = request.generation.max_new_tokens;
  tracked_[id] = t;
}

void BudgetPlanner::Forget(RequestId id) {
  tracked_.erase(id);
  policy_.Forget(id);
}

void BudgetPlanner::OnStep(const StepReport& report, double wall_seconds) {
  if (trace_ != nullptr) {
    trace_->Write(trace_label_, traced_steps_++, planned_ ? &traced_ : nullptr, report,
                  wall_seconds);
  }
  planned_ = false;
  StepMeasurement m;
  m.shape = {.tokens = report.prefill_tokens + report.verify_tokens,
             .attention = report.attention,
             .chunk_tokens = report.prefill_tokens,
             .chunk_attention = report.prefill_attention};
  m.target_seconds = report.verify_seconds;
  m.other_seconds = wall_seconds > 0
                        ? std::max(0.0, wall_seconds - report.verify_seconds - report.draft_seconds)
                        : 0.0;
  m.drafter_calls = report.drafter_calls;
  // Prompt chunks are prefilled in admission order (SpecEngine::PlanChunks).
  int64_t prefilled = report.prefill_tokens;
  for (auto& [id, t] : tracked_) {
    if (t.decoding || prefilled <= 0) continue;
    const int64_t take = std::min(prefilled, t.prefill_left);
    t.prefill_left -= take;
    prefilled -= take;
  }
  for (const RequestUpdate& u : report.updates) {
    auto it = tracked_.find(u.id);
    if (it == tracked_.end()) continue;
    Tracked& t = it->second;
    // A budget that came back short (or empty) is the drafter's supply; a draft nobody asked for
    // (a fixed budget) still teaches acceptance.
    if (u.draft_nodes > 0 || t.asked > 0) {
      m.sequences.push_back({.id = u.id,
                             .drafter = t.drafter,
                             .nodes = u.draft_nodes,
                             .depth = u.draft_depth,
                             .accepted = u.draft_accepted,
                             .asked = t.asked});
    }
    t.asked = 0;
    if (u.finished) {
      Forget(u.id);
      continue;
    }
    if (!u.new_tokens.empty()) {
      t.decoding = true;
      t.prefill_left = 0;
      t.tokens_left -= static_cast<int64_t>(u.new_tokens.size());
    }
    t.context = u.context_tokens;
    t.unobserved = u.unobserved_tokens;
    t.max_nodes = u.max_draft_nodes;
  }
  policy_.Observe(m);
}

std::vector<StepPlan::DraftBudget> BudgetPlanner::Plan() {
  StepBase base;
  std::vector<BudgetCandidate> candidates;
  int64_t prefill = 0;
  for (const auto& [id, t] : tracked_) {
    if (!t.decoding) {
      prefill += t.prefill_left;
      continue;
    }
    ++base.decoding;
    base.shape.attention += static_cast<double>(t.context + 1);
    if (!t.drafter.empty() && t.max_nodes > 0) {
      candidates.push_back({.id = id,
                            .drafter = t.drafter,
                            .max_nodes = std::min(t.max_nodes, t.cap),
                            .context = t.context,
                            .unobserved_tokens = t.unobserved,
                            .tokens_left = std::max<int64_t>(t.tokens_left, 0)});
    }
  }
  // The prompt chunks this step: what the decodes leave of the step's token budget.
  if (max_step_tokens_ > 0) {
    prefill = std::min(prefill, std::max<int64_t>(max_step_tokens_ - base.decoding, 1));
  }
  base.shape.tokens = base.decoding + prefill;
  // The chunks' attention as the engine counts it (SpecEngine::PlanChunks: in admission order,
  // each chunk's rows x the context after it).
  double chunk_attention = 0;
  int64_t left = prefill;
  for (const auto& [id, t] : tracked_) {
    if (t.decoding || left <= 0) continue;
    const int64_t take = std::min(left, t.prefill_left);
    chunk_attention +=
        static_cast<double>(take) * static_cast<double>(t.prompt - t.prefill_left + take);
    left -= take;
  }
  base.chunks = {.tokens = prefill,
                 .attention = chunk_attention,
                 .chunk_tokens = prefill,
                 .chunk_attention = chunk_attention};
  base.shape.chunk_tokens = prefill;
  base.shape.attention += chunk_attention;
  base.shape.chunk_attention = chunk_attention;
  if (max_step_tokens_ > 0)
    base.max_nodes = std::max<int64_t>(0, max_step_tokens_ - base.shape.tokens);
  const uint64_t quiet_before = policy_.quiet_plans();
  const uint64_t audited_before = policy_.audited_plans();
  last_ = policy_.Plan(base, candidates);
  if (trace_ != nullptr) {
    traced_ = {.base = base,
               .decision = last_,
               .quiet = policy_.quiet_plans() > quiet_before,
               .audit_off = policy_.audited_plans() > audited_before};
    planned_ = true;
  }
  std::vector<StepPlan::DraftBudget> budgets;
  for (size_t i = 0; i < candidates.size(); ++i) {
    budgets.push_back({.id = candidates[i].id,
                       .max_draft_tokens = last_.budgets[i],
                       .min_reach = last_.min_reach,
                       .depth_reach = last_.depth_reach[i],
                       .quiet_steps = last_.quiet_steps});
    tracked_[candidates[i].id].asked = last_.budgets[i];
  }
  // Admitted requests that cannot draft this step (prefilling, no room) get 0 explicitly.
  for (const auto& [id, t] : tracked_) {
    if (t.drafter.empty()) continue;
    if (!t.decoding || t.max_nodes <= 0) budgets.push_back({.id = id, .max_draft_tokens = 0});
  }
  return budgets;
}

}  // namespace specula
