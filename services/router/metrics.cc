#include "services/router/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <map>
#include <vector>

#include "services/common/metrics_registry.h"

namespace specula::router {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;

// Bucket boundaries follow vLLM's.
const Histogram::BucketBoundaries kTtftBuckets = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const Histogram::BucketBoundaries kItlBuckets = {0.001, 0.005, 0.01, 0.025, 0.05, 0.075,
                                                 0.1,   0.15,  0.2,  0.3,   0.4,  0.5,
                                                 0.75,  1.0,   2.5,  5.0,   7.5,  10.0};
const Histogram::BucketBoundaries kE2eBuckets = {0.05, 0.1,  0.3,  0.5,  0.8,   1.0,   1.5,
                                                 2.0,  2.5,  5.0,  10.0, 15.0,  20.0,  30.0,
                                                 40.0, 50.0, 60.0, 120., 240.0, 480.0, 960.0};

}  // namespace

struct RouterMetrics::Impl {
  services::MetricsRegistry metrics;
  prometheus::Registry* registry = &metrics.registry();

  Counter& num_drafts = BuildCounter()
                            .Name("specula_spec_decode_num_drafts_total")
                            .Help("Speculative steps that verified a non-empty draft.")
                            .Register(*registry)
                            .Add({});
  Counter& num_draft_tokens = BuildCounter()
                                  .Name("specula_spec_decode_num_draft_tokens_total")
                                  .Help("Draft tokens proposed.")
                                  .Register(*registry)
                                  .Add({});
  Counter& num_accepted_tokens = BuildCounter()
                                     .Name("specula_spec_decode_num_accepted_tokens_total")
                                     .Help("Draft tokens accepted by verification.")
                                     .Register(*registry)
                                     .Add({});
  Family<Counter>& accepted_per_pos =
      BuildCounter()
          .Name("specula_spec_decode_num_accepted_tokens_per_pos_total")
          .Help("Draft tokens accepted at each draft position (0 = first draft token).")
          .Register(*registry);
  Counter& lossy_requests =
      BuildCounter()
          .Name("specula_spec_decode_lossy_requests_total")
          .Help("Requests verified with a LOSSY rule (specdec, typical) at their own request.")
          .Register(*registry)
          .Add({});
  Counter& steps = BuildCounter()
                       .Name("specula_engine_steps_total")
                       .Help("Engine steps the router ran (one target forward each).")
                       .Register(*registry)
                       .Add({});
  Histogram& step_seconds =
      BuildHistogram()
          .Name("specula_engine_step_seconds")
          .Help("One engine step as the router sees it, transport to the target included.")
          .Register(*registry)
          .Add({}, Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16,
                                               0.32, 0.64, 1.28, 2.56});
  Counter& transport_seconds =
      BuildCounter()
          .Name("specula_engine_step_transport_seconds_total")
          .Help(
              "Step time outside the target's own step: the router-target path (0 in one "
              "process).")
          .Register(*registry)
          .Add({});
  Histogram& ttft = BuildHistogram()
                        .Name("specula_time_to_first_token_seconds")
                        .Help("Time from request arrival to its first token.")
                        .Register(*registry)
                        .Add({}, kTtftBuckets);
  Histogram& itl = BuildHistogram()
                       .Name("specula_inter_token_latency_seconds")
                       .Help(
                           "Time between two deliveries of tokens to a request (one per engine "
                           "step; a step may deliver several tokens).")
                       .Register(*registry)
                       .Add({}, kItlBuckets);
  Histogram& e2e = BuildHistogram()
                       .Name("specula_e2e_request_latency_seconds")
                       .Help("Time from request arrival to its end.")
                       .Register(*registry)
                       .Add({}, kE2eBuckets);
  Gauge& running = BuildGauge()
                       .Name("specula_num_requests_running")
                       .Help("Requests in the engine's batch.")
                       .Register(*registry)
                       .Add({});
  Gauge& waiting = BuildGauge()
                       .Name("specula_num_requests_waiting")
                       .Help("Requests accepted but not yet in the engine's batch.")
                       .Register(*registry)
                       .Add({});
  Gauge& kv_usage = BuildGauge()
                        .Name("specula_kv_cache_usage_perc")
                        .Help("Fraction of the target's KV cache blocks in use (0..1).")
                        .Register(*registry)
                        .Add({});
  Family<Counter>& success = BuildCounter()
                                 .Name("specula_request_success_total")
                                 .Help("Finished requests by finish reason.")
                                 .Register(*registry);
  Family<Counter>& rejected =
      BuildCounter()
          .Name("specula_request_rejected_total")
          .Help("Requests refused before reaching the engine, by gRPC code.")
          .Register(*registry);
  Counter& prompt_tokens = BuildCounter()
                               .Name("specula_prompt_tokens_total")
                               .Help("Prompt tokens of requests that entered the engine.")
                               .Register(*registry)
                               .Add({});
  Counter& generation_tokens = BuildCounter()
                                   .Name("specula_generation_tokens_total")
                                   .Help("Generated tokens delivered to clients.")
                                   .Register(*registry)
                                   .Add({});

  Histogram& budget_nodes =
      BuildHistogram()
          .Name("specula_draft_budget_nodes")
          .Help("Draft nodes the adaptive budget gave one sequence for one step (0 = no draft).")
          .Register(*registry)
          .Add({}, Histogram::BucketBoundaries{0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128});
  Counter& budget_predicted = BuildCounter()
                                  .Name("specula_draft_budget_predicted_seconds_total")
                                  .Help("Step seconds the draft budget's cost model predicted.")
                                  .Register(*registry)
                                  .Add({});
  Counter& budget_measured =
      BuildCounter()
          .Name("specula_draft_budget_measured_seconds_total")
          .Help("Step seconds measured for the steps the cost model predicted.")
          .Register(*registry)
          .Add({});
  Gauge& budget_speedup =
      BuildGauge()
          .Name("specula_draft_budget_predicted_speedup")
          .Help("Predicted tokens/s at the chosen budgets over tokens/s without drafts.")
          .Register(*registry)
          .Add({});
  Gauge& spare_tokens =
      BuildGauge()
          .Name("specula_draft_budget_spare_tokens")
          .Help("Spare compute: tokens the step's forward could add within 5% of its time.")
          .Register(*registry)
          .Add({});
  Gauge& kappa = BuildGauge()
                     .Name("specula_spec_decode_kappa")
                     .Help("kappa = a * depth / k over recent drafting steps (SpecFormer).")
                     .Register(*registry)
                     .Add({});
  Gauge& theta = BuildGauge()
                     .Name("specula_spec_decode_theta")
                     .Help("theta = kappa / predicted speedup (lower is better).")
                     .Register(*registry)
                     .Add({});
  Gauge& draft_share = BuildGauge()
                           .Name("specula_spec_decode_draft_time_share")
                           .Help("Drafters' share of recent step time.")
                           .Register(*registry)
                           .Add({});
  Family<Gauge>& acceptance =
      BuildGauge()
          .Name("specula_spec_decode_acceptance_prob")
          .Help("Per drafter, P(position accepted | previous position accepted), recent steps.")
          .Register(*registry);

  Impl() {
    // Every finish reason is listed from the start, so dashboards see zeros rather than gaps.
    for (FinishReason r : {FinishReason::kStop, FinishReason::kLength, FinishReason::kStopString,
                           FinishReason::kCancelled, FinishReason::kError}) {
      success.Add({{"finished_reason", FinishReasonName(r)}});
    }
  }
};

RouterMetrics::RouterMetrics() : impl_(std::make_unique<Impl>()) {}
RouterMetrics::~RouterMetrics() = default;  // MetricsRegistry stops its endpoint first

StatusOr<int> RouterMetrics::Expose(const std::string& host, int port) {
  return impl_->metrics.Expose(host, port);
}

std::string RouterMetrics::Text() const { return impl_->metrics.Text(); }

void RouterMetrics::StepTimed(double router_seconds, double target_seconds) {
  impl_->steps.Increment();
  impl_->step_seconds.Observe(router_seconds);
  impl_->transport_seconds.Increment(std::max(0.0, router_seconds - target_seconds));
}

void RouterMetrics::DraftBudget(const BudgetSnapshot& s) {
  for (int32_t b : s.budgets) impl_->budget_nodes.Observe(static_cast<double>(b));
  impl_->budget_predicted.Increment(std::max(0.0, s.predicted_seconds));
  impl_->budget_measured.Increment(std::max(0.0, s.measured_seconds));
  impl_->budget_speedup.Set(s.predicted_speedup);
  impl_->spare_tokens.Set(s.spare_tokens);
  impl_->kappa.Set(s.kappa);
  impl_->theta.Set(s.theta);
  impl_->draft_share.Set(s.draft_share);
  for (const auto& [drafter, p] : s.acceptance) {
    for (size_t d = 0; d < p.size(); ++d) {
      impl_->acceptance.Add({{"drafter", drafter}, {"position", std::to_string(d)}}).Set(p[d]);
    }
  }
}

void RouterMetrics::DeclareDraftPositions(int n) {
  for (int d = 0; d < n; ++d) impl_->accepted_per_pos.Add({{"position", std::to_string(d)}});
}

void RouterMetrics::Rejected(StatusCode code) {
  impl_->rejected.Add({{"code", std::string(StatusCodeName(code))}}).Increment();
}

void RouterMetrics::Admitted(int64_t prompt_tokens, bool lossy) {
  impl_->prompt_tokens.Increment(static_cast<double>(prompt_tokens));
  if (lossy) impl_->lossy_requests.Increment();
}

void RouterMetrics::TokensDelivered(int64_t tokens, bool first, double seconds_since_previous) {
  impl_->generation_tokens.Increment(static_cast<double>(tokens));
  (first ? impl_->ttft : impl_->itl).Observe(seconds_since_previous);
}

void RouterMetrics::SpecProgress(const SpecRequestStats& before, const SpecRequestStats& after) {
  auto add = [](Counter& c, int64_t delta) {
    if (delta > 0) c.Increment(static_cast<double>(delta));
  };
  add(impl_->num_drafts, after.draft_steps - before.draft_steps);
  add(impl_->num_draft_tokens, after.draft_tokens - before.draft_tokens);
  add(impl_->num_accepted_tokens, after.accepted_tokens - before.accepted_tokens);
  for (size_t d = 0; d < after.accepted_per_position.size(); ++d) {
    const int64_t was =
        d < before.accepted_per_position.size() ? before.accepted_per_position[d] : 0;
    if (after.accepted_per_position[d] > was) {
      add(impl_->accepted_per_pos.Add({{"position", std::to_string(d)}}),
          after.accepted_per_position[d] - was);
    }
  }
}

void RouterMetrics::Finished(FinishReason reason, double e2e_seconds) {
  impl_->success.Add({{"finished_reason", FinishReasonName(reason)}}).Increment();
  impl_->e2e.Observe(e2e_seconds);
}

void RouterMetrics::SetLoad(int64_t running, int64_t waiting, double kv_cache_usage) {
  impl_->running.Set(static_cast<double>(running));
  impl_->waiting.Set(static_cast<double>(waiting));
  impl_->kv_usage.Set(kv_cache_usage);
}

}  // namespace specula::router
