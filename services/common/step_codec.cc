#include "services/common/step_codec.h"

#include <cmath>
#include <utility>

#include "services/common/grpc_status.h"

namespace specula::services {

v1::VerifyMode ToProto(VerifyMode mode) {
  switch (mode) {
    case VerifyMode::kLossless:
      return v1::VERIFY_MODE_LOSSLESS;
    case VerifyMode::kSpecDec:
      return v1::VERIFY_MODE_SPECDEC;
    case VerifyMode::kTypical:
      return v1::VERIFY_MODE_TYPICAL;
  }
  return v1::VERIFY_MODE_UNSPECIFIED;
}

StatusOr<VerifyMode> FromProto(v1::VerifyMode mode, const std::string& field) {
  switch (mode) {
    case v1::VERIFY_MODE_UNSPECIFIED:
    case v1::VERIFY_MODE_LOSSLESS:
      return VerifyMode::kLossless;
    case v1::VERIFY_MODE_SPECDEC:
      return VerifyMode::kSpecDec;
    case v1::VERIFY_MODE_TYPICAL:
      return VerifyMode::kTypical;
    default:
      return InvalidArgumentError(
          StrCat(field, ": unknown verification mode ", static_cast<int>(mode)));
  }
}

void ToProto(const SamplingParams& params, v1::SamplingParams* out) {
  out->set_temperature(params.temperature);
  out->set_top_k(params.top_k);
  out->set_top_p(params.top_p);
  out->set_seed(params.seed);
}

SamplingParams FromProto(const v1::SamplingParams& params) {
  SamplingParams out;
  out.temperature = params.temperature();
  out.top_k = params.top_k();
  if (params.has_top_p()) out.top_p = params.top_p();
  if (params.has_seed()) out.seed = params.seed();
  return out;
}

void ToProto(const SpecRequest& request, v1::EngineRequest* out) {
  const GenerationRequest& g = request.generation;
  out->mutable_prompt()->Assign(g.prompt.begin(), g.prompt.end());
  ToProto(g.sampling, out->mutable_sampling());
  out->set_max_new_tokens(g.max_new_tokens);
  out->mutable_stop_token_ids()->Assign(g.stop_token_ids.begin(), g.stop_token_ids.end());
  const SpeculationSettings& s = request.speculation;
  out->set_drafter(s.drafter);
  out->set_max_draft_tokens(s.max_draft_tokens);
  out->set_verify(ToProto(s.verify.mode));
  out->set_specdec_beta(s.verify.specdec_beta);
  out->set_specdec_tau(s.verify.specdec_tau);
  out->set_typical_epsilon(s.verify.typical_epsilon);
  out->set_typical_delta(s.verify.typical_delta);
}

StatusOr<SpecRequest> FromProto(const v1::EngineRequest& request, const std::string& field) {
  SpecRequest out;
  GenerationRequest& g = out.generation;
  g.prompt.assign(request.prompt().begin(), request.prompt().end());
  g.sampling = FromProto(request.sampling());
  g.max_new_tokens = request.max_new_tokens();
  g.stop_token_ids.assign(request.stop_token_ids().begin(), request.stop_token_ids().end());
  SpeculationSettings& s = out.speculation;
  s.drafter = request.drafter();
  s.max_draft_tokens = request.max_draft_tokens();
  ASSIGN_OR_RETURN(s.verify.mode, FromProto(request.verify(), field + ".verify"));
  // 0 (proto3's "unset") keeps the engine's default; none of these is valid at 0.
  if (request.specdec_beta() != 0) s.verify.specdec_beta = request.specdec_beta();
  if (request.specdec_tau() != 0) s.verify.specdec_tau = request.specdec_tau();
  if (request.typical_epsilon() != 0) s.verify.typical_epsilon = request.typical_epsilon();
  if (request.typical_delta() != 0) s.verify.typical_delta = request.typical_delta();
  return out;
}

void ToProto(const StepPlan& plan, v1::StepPlan* out) {
  for (const StepPlan::Admission& a : plan.admit) {
    v1::Admission* m = out->add_admit();
    m->set_request_id(a.id);
    ToProto(a.request, m->mutable_request());
  }
  out->mutable_cancel()->Assign(plan.cancel.begin(), plan.cancel.end());
  for (const StepPlan::DraftBudget& b : plan.budgets) {
    v1::DraftBudget* m = out->add_budgets();
    m->set_request_id(b.id);
    m->set_max_draft_tokens(b.max_draft_tokens);
    m->set_min_reach(b.min_reach);
    m->set_depth_reach(b.depth_reach);
    m->set_quiet_steps(b.quiet_steps);
  }
}

StatusOr<StepPlan> FromProto(const v1::StepPlan& plan) {
  StepPlan out;
  for (int i = 0; i < plan.admit_size(); ++i) {
    const v1::Admission& a = plan.admit(i);
    ASSIGN_OR_RETURN(SpecRequest request, FromProto(a.request(), StrCat("admit[", i, "].request")));
    out.admit.push_back({.id = a.request_id(), .request = std::move(request)});
  }
  out.cancel.assign(plan.cancel().begin(), plan.cancel().end());
  for (int i = 0; i < plan.budgets_size(); ++i) {
    const v1::DraftBudget& b = plan.budgets(i);
    if (!(b.min_reach() >= 0 && b.min_reach() <= 1)) {  // NaN fails too
      return InvalidArgumentError(
          StrCat("budgets[", i, "].min_reach must be in [0, 1], got ", b.min_reach()));
    }
    if (!(b.depth_reach() >= 0 && std::isfinite(b.depth_reach()))) {
      return InvalidArgumentError(StrCat(
          "budgets[", i, "].depth_reach must be finite and at least 0, got ", b.depth_reach()));
    }
    if (b.quiet_steps() < 0) {
      return InvalidArgumentError(
          StrCat("budgets[", i, "].quiet_steps must be at least 0, got ", b.quiet_steps()));
    }
    out.budgets.push_back({.id = b.request_id(),
                           .max_draft_tokens = b.max_draft_tokens(),
                           .min_reach = b.min_reach(),
                           .depth_reach = b.depth_reach(),
                           .quiet_steps = b.quiet_steps()});
  }
  return out;
}

void ToProto(const StepOutcome& outcome, v1::StepResult* out) {
  const StepReport& r = outcome.report;
  for (const RequestUpdate& u : r.updates) {
    v1::EngineUpdate* m = out->add_updates();
    m->set_request_id(u.id);
    m->mutable_new_tokens()->Assign(u.new_tokens.begin(), u.new_tokens.end());
    m->set_finished(u.finished);
    if (u.finished) m->set_finish_reason(FinishReasonName(u.finish_reason));
    m->set_error_code(static_cast<int32_t>(u.error.code()));
    m->set_error_message(u.error.message());
    v1::EngineStats* s = m->mutable_stats();
    s->set_steps(u.stats.steps);
    s->set_draft_steps(u.stats.draft_steps);
    s->set_draft_tokens(u.stats.draft_tokens);
    s->set_draft_depth(u.stats.draft_depth);
    s->set_accepted_tokens(u.stats.accepted_tokens);
    s->mutable_accepted_per_position()->Assign(u.stats.accepted_per_position.begin(),
                                               u.stats.accepted_per_position.end());
    s->set_draft_errors(u.stats.draft_errors);
    s->set_last_draft_error(u.stats.last_draft_error);
    s->set_lossy(u.stats.lossy);
    m->set_draft_nodes(u.draft_nodes);
    m->set_draft_depth(u.draft_depth);
    m->set_draft_accepted(u.draft_accepted);
    m->set_context_tokens(u.context_tokens);
    m->set_unobserved_tokens(u.unobserved_tokens);
    m->set_max_draft_nodes(u.max_draft_nodes);
  }
  out->set_batch_size(r.batch_size);
  out->set_prefill_tokens(r.prefill_tokens);
  out->set_verify_tokens(r.verify_tokens);
  out->set_draft_seconds(r.draft_seconds);
  out->set_verify_seconds(r.verify_seconds);
  out->set_step_seconds(outcome.step_seconds);
  out->set_kv_cache_blocks_used(outcome.kv_blocks_used);
  out->set_forward_seconds(r.forward_seconds);
  out->set_attention(r.attention);
  out->set_prefill_attention(r.prefill_attention);
  for (const DrafterCall& c : r.drafter_calls) {
    v1::DrafterCallTiming* m = out->add_drafter_calls();
    m->set_drafter(c.drafter);
    m->set_sequences(c.sequences);
    m->set_nodes(c.nodes);
    m->set_max_depth(c.max_depth);
    m->set_observed_tokens(c.observed_tokens);
    m->set_seconds(c.seconds);
  }
}

StepOutcome FromProto(const v1::StepResult& result) {
  StepOutcome out;
  StepReport& r = out.report;
  for (int i = 0; i < result.updates_size(); ++i) {
    const v1::EngineUpdate& m = result.updates(i);
    RequestUpdate u;
    u.id = m.request_id();
    u.new_tokens.assign(m.new_tokens().begin(), m.new_tokens().end());
    u.finished = m.finished();
    u.error = StatusFromCode(m.error_code(), m.error_message());
    if (u.finished) {
      // An unknown name (a newer or broken peer) ends that request alone, as an error.
      StatusOr<FinishReason> reason = ParseFinishReason(m.finish_reason());
      if (reason.ok()) {
        u.finish_reason = *reason;
      } else {
        u.finish_reason = FinishReason::kError;
        if (u.error.ok()) {
          u.error = reason.status().WithContext(StrCat("updates[", i, "].finish_reason"));
        }
      }
    }
    const v1::EngineStats& s = m.stats();
    u.stats.steps = s.steps();
    u.stats.draft_steps = s.draft_steps();
    u.stats.draft_tokens = s.draft_tokens();
    u.stats.draft_depth = s.draft_depth();
    u.stats.accepted_tokens = s.accepted_tokens();
    u.stats.accepted_per_position.assign(s.accepted_per_position().begin(),
                                         s.accepted_per_position().end());
    u.stats.draft_errors = s.draft_errors();
    u.stats.last_draft_error = s.last_draft_error();
    u.stats.lossy = s.lossy();
    u.draft_nodes = m.draft_nodes();
    u.draft_depth = m.draft_depth();
    u.draft_accepted = m.draft_accepted();
    u.context_tokens = m.context_tokens();
    u.unobserved_tokens = m.unobserved_tokens();
    u.max_draft_nodes = m.max_draft_nodes();
    r.updates.push_back(std::move(u));
  }
  r.batch_size = result.batch_size();
  r.prefill_tokens = result.prefill_tokens();
  r.verify_tokens = result.verify_tokens();
  r.draft_seconds = result.draft_seconds();
  r.verify_seconds = result.verify_seconds();
  out.step_seconds = result.step_seconds();
  out.kv_blocks_used = result.kv_cache_blocks_used();
  r.forward_seconds = result.forward_seconds();
  r.attention = result.attention();
  r.prefill_attention = result.prefill_attention();
  for (const v1::DrafterCallTiming& m : result.drafter_calls()) {
    r.drafter_calls.push_back({.drafter = m.drafter(),
                               .sequences = m.sequences(),
                               .nodes = m.nodes(),
                               .max_depth = m.max_depth(),
                               .observed_tokens = m.observed_tokens(),
                               .seconds = m.seconds()});
  }
  return out;
}

void ToProto(const TargetInfo& info, v1::TargetInfo* out) {
  out->set_model_type(info.model_type);
  out->set_vocab_size(info.vocab_size);
  out->set_context_length(info.context_length);
  out->mutable_eos_token_ids()->Assign(info.eos_token_ids.begin(), info.eos_token_ids.end());
  for (const std::string& d : info.drafters) out->add_drafters(d);
  out->set_kv_cache_blocks(info.kv_cache_blocks);
  out->set_kv_block_size(info.kv_block_size);
  out->set_max_batch_size(info.max_batch_size);
  out->set_max_step_tokens(info.max_step_tokens);
  out->set_dtype(info.dtype);
  out->set_device(info.device);
}

TargetInfo FromProto(const v1::TargetInfo& info) {
  TargetInfo out;
  out.model_type = info.model_type();
  out.vocab_size = info.vocab_size();
  out.context_length = info.context_length();
  out.eos_token_ids.assign(info.eos_token_ids().begin(), info.eos_token_ids().end());
  out.drafters.assign(info.drafters().begin(), info.drafters().end());
  out.kv_cache_blocks = info.kv_cache_blocks();
  out.kv_block_size = info.kv_block_size();
  out.max_batch_size = info.max_batch_size();
  out.max_step_tokens = info.max_step_tokens();
  out.dtype = info.dtype();
  out.device = info.device();
  return out;
}

}  // namespace specula::services
