#include "services/router/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <map>
#include <string>
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
// vLLM's request_latency_buckets: queue, prefill, decode and inference time.
const Histogram::BucketBoundaries kRequestLatencyBuckets = {
    0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const Histogram::BucketBoundaries kTpotBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                                  0.3,  0.4,   0.5,  0.75,  1.0, 2.5,  5.0,
                                                  7.5,  10.0,  20.0, 40.0,  80.0};

// vLLM's build_1_2_5_buckets(max_model_len): 1, 2, 5, 10, 20, 50, ... up to max_value.
Histogram::BucketBoundaries OneTwoFiveBuckets(int64_t max_value) {
  Histogram::BucketBoundaries out;
  for (double scale = 1; out.empty() || out.back() < static_cast<double>(max_value); scale *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m * scale > static_cast<double>(std::max<int64_t>(max_value, 1))) return out;
      out.push_back(m * scale);
    }
  }
  return out;
}

// A per-position gauge family's gauges for one label set (a drafter, a streak), created on first
// use: Family::Add builds and hashes its labels on every call, and a step sets every position
// of every drafter.
class PositionGauges {
 public:
  explicit PositionGauges(Family<Gauge>& family) : family_(family) {}
  void Set(const prometheus::Labels& labels, const std::vector<double>& values) {
    std::string key;
    for (const auto& [name, value] : labels) key += value + '\0';
    std::vector<Gauge*>& gauges = gauges_[key];
    while (gauges.size() < values.size()) {
      prometheus::Labels with = labels;
      with["position"] = std::to_string(gauges.size());
      gauges.push_back(&family_.Add(with));
    }
    for (size_t d = 0; d < values.size(); ++d) gauges[d]->Set(values[d]);
  }

 private:
  Family<Gauge>& family_;
  std::map<std::string, std::vector<Gauge*>> gauges_;
};

const Histogram::BucketBoundaries kE2eBuckets = {0.05, 0.1,  0.3,  0.5,  0.8,   1.0,   1.5,
                                                 2.0,  2.5,  5.0,  10.0, 15.0,  20.0,  30.0,
                                                 40.0, 50.0, 60.0, 120., 240.0, 480.0, 960.0};

}  // namespace

struct RouterMetrics::Impl {
  explicit Impl(const RouterMetricsOptions& options)
      : labels(options.model_name.empty() ? prometheus::Labels{}
                                          : prometheus::Labels{{"model_name", options.model_name}}),
        token_buckets(OneTwoFiveBuckets(options.max_model_len)) {
    // Every finish reason is listed from the start, so dashboards see zeros rather than gaps.
    for (FinishReason r : kAllFinishReasons) {
      success.Add(
          {{"finished_reason", VllmFinishReason(r)}, {"specula_reason", FinishReasonName(r)}});
    }
  }

  // Declared first: every family below is built with them.
  const prometheus::Labels labels;  // model_name, as vLLM's
  const Histogram::BucketBoundaries token_buckets;
  services::MetricsRegistry metrics;
  prometheus::Registry* registry = &metrics.registry();

  Counter& num_drafts = BuildCounter()
                            .Name("specula_spec_decode_num_drafts_total")
                            .Help("Speculative steps that verified a non-empty draft.")
                            .Labels(labels)
                            .Register(*registry)
                            .Add({});
  Counter& num_draft_tokens = BuildCounter()
                                  .Name("specula_spec_decode_num_draft_tokens_total")
                                  .Help("Draft tokens proposed.")
                                  .Labels(labels)
                                  .Register(*registry)
                                  .Add({});
  Counter& num_accepted_tokens = BuildCounter()
                                     .Name("specula_spec_decode_num_accepted_tokens_total")
                                     .Help("Draft tokens accepted by verification.")
                                     .Labels(labels)
                                     .Register(*registry)
                                     .Add({});
  Counter& draft_errors =
      BuildCounter()
          .Name("specula_spec_decode_draft_errors_total")
          .Help(
              "Drafts dropped: a drafter call failed or was late, or its tree was invalid. "
              "Output stays lossless; the step ran without speculation for that sequence, "
              "or the sequence was detached from a drafter that failed twice.")
          .Labels(labels)
          .Register(*registry)
          .Add({});
  Family<Counter>& accepted_per_pos =
      BuildCounter()
          .Name("specula_spec_decode_num_accepted_tokens_per_pos_total")
          .Help("Draft tokens accepted at each draft position (0 = first draft token).")
          .Labels(labels)
          .Register(*registry);
  Counter& lossy_requests =
      BuildCounter()
          .Name("specula_spec_decode_lossy_requests_total")
          .Help("Requests verified with a LOSSY rule (specdec, typical) at their own request.")
          .Labels(labels)
          .Register(*registry)
          .Add({});
  Counter& steps = BuildCounter()
                       .Name("specula_engine_steps_total")
                       .Help("Engine steps the router ran (one target forward each).")
                       .Labels(labels)
                       .Register(*registry)
                       .Add({});
  Histogram& step_seconds =
      BuildHistogram()
          .Name("specula_engine_step_seconds")
          .Help("One engine step as the router sees it, transport to the target included.")
          .Labels(labels)
          .Register(*registry)
          .Add({}, Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16,
                                               0.32, 0.64, 1.28, 2.56});
  Counter& transport_seconds =
      BuildCounter()
          .Name("specula_engine_step_transport_seconds_total")
          .Help(
              "Step time outside the target's own step: the router-target path (0 in one "
              "process).")
          .Labels(labels)
          .Register(*registry)
          .Add({});
  Histogram& ttft = BuildHistogram()
                        .Name("specula_time_to_first_token_seconds")
                        .Help("Time from request arrival to its first token.")
                        .Labels(labels)
                        .Register(*registry)
                        .Add({}, kTtftBuckets);
  Histogram& itl = BuildHistogram()
                       .Name("specula_inter_token_latency_seconds")
                       .Help(
                           "Time between two deliveries of tokens to a request (one per engine "
                           "step; a step may deliver several tokens).")
                       .Labels(labels)
                       .Register(*registry)
                       .Add({}, kItlBuckets);
  Histogram& e2e = BuildHistogram()
                       .Name("specula_e2e_request_latency_seconds")
                       .Help("Time from request arrival to its end.")
                       .Labels(labels)
                       .Register(*registry)
                       .Add({}, kE2eBuckets);
  Gauge& running = BuildGauge()
                       .Name("specula_num_requests_running")
                       .Help("Requests in the engine's batch.")
                       .Labels(labels)
                       .Register(*registry)
                       .Add({});
  Gauge& waiting = BuildGauge()
                       .Name("specula_num_requests_waiting")
                       .Help("Requests accepted but not yet in the engine's batch.")
                       .Labels(labels)
                       .Register(*registry)
                       .Add({});
  Gauge& kv_usage = BuildGauge()
                        .Name("specula_kv_cache_usage_perc")
                        .Help("Fraction of the target's KV cache blocks in use (0..1).")
                        .Labels(labels)
                        .Register(*registry)
                        .Add({});
  Family<Counter>& success = BuildCounter()
                                 .Name("specula_request_success_total")
                                 .Help("Finished requests by finish reason.")
                                 .Labels(labels)
                                 .Register(*registry);
  Family<Counter>& rejected =
      BuildCounter()
          .Name("specula_request_rejected_total")
          .Help("Requests refused before reaching the engine, by gRPC code.")
          .Labels(labels)
          .Register(*registry);
  Counter& prompt_tokens = BuildCounter()
                               .Name("specula_prompt_tokens_total")
                               .Help("Prompt tokens of requests that entered the engine.")
                               .Labels(labels)
                               .Register(*registry)
                               .Add({});
  Counter& generation_tokens = BuildCounter()
                                   .Name("specula_generation_tokens_total")
                                   .Help("Generated tokens delivered to clients.")
                                   .Labels(labels)
                                   .Register(*registry)
                                   .Add({});

  Histogram& budget_nodes =
      BuildHistogram()
          .Name("specula_draft_budget_nodes")
          .Help("Draft nodes the adaptive budget gave one sequence for one step (0 = no draft).")
          .Labels(labels)
          .Register(*registry)
          .Add({}, Histogram::BucketBoundaries{0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128});
  Counter& budget_predicted = BuildCounter()
                                  .Name("specula_draft_budget_predicted_seconds_total")
                                  .Help("Step seconds the draft budget's cost model predicted.")
                                  .Labels(labels)
                                  .Register(*registry)
                                  .Add({});
  Counter& budget_measured =
      BuildCounter()
          .Name("specula_draft_budget_measured_seconds_total")
          .Help("Step seconds measured for the steps the cost model predicted.")
          .Labels(labels)
          .Register(*registry)
          .Add({});
  Gauge& budget_speedup =
      BuildGauge()
          .Name("specula_draft_budget_predicted_speedup")
          .Help("Predicted tokens/s at the chosen budgets over tokens/s without drafts.")
          .Labels(labels)
          .Register(*registry)
          .Add({});
  Gauge& realized_speedup =
      BuildGauge()
          .Name("specula_draft_budget_realized_speedup")
          .Help(
              "Measured tokens/s of drafting epochs over no-draft epochs next to them (the "
              "drafting audit; 1 before its first comparison).")
          .Labels(labels)
          .Register(*registry)
          .Add({});
  Gauge& drafting_verdict =
      BuildGauge()
          .Name("specula_draft_budget_drafting_verdict")
          .Help(
              "The drafting audit's verdict: 1 drafting pays (no-draft checks now and then), 0 it "
              "does not (drafting trials now and then), -1 not measured yet.")
          .Labels(labels)
          .Register(*registry)
          .Add({});
  Gauge& spare_tokens =
      BuildGauge()
          .Name("specula_draft_budget_spare_tokens")
          .Help("Spare compute: tokens the step's forward could add within 5% of its time.")
          .Labels(labels)
          .Register(*registry)
          .Add({});
  Gauge& gap_p99 =
      BuildGauge()
          .Name("specula_draft_budget_gap_p99_seconds")
          .Help(
              "The p99 gap between streamed chunks without drafts, over the last 1,024 planned "
              "steps (each step's wall less what its drafts were predicted to add, weighted by "
              "the sequences that waited for it); 0 until measured.")
          .Labels(labels)
          .Register(*registry)
          .Add({});
  Gauge& overrun_p999 =
      BuildGauge()
          .Name("specula_draft_budget_overrun_p999_seconds")
          .Help(
              "The p99.9 of how much longer than planned the last 1,024 planned steps ran; 0 "
              "until measured. --max-draft-slowdown X lets a step take up to (1 + X) times the "
              "p99 gap less this.")
          .Labels(labels)
          .Register(*registry)
          .Add({});
  Gauge& row_price =
      BuildGauge()
          .Name("specula_draft_budget_row_price")
          .Help(
              "The chance of being accepted a draft node needs to be worth its forward row: "
              "one more row's predicted seconds times the step's tokens per second.")
          .Labels(labels)
          .Register(*registry)
          .Add({});
  Gauge& kappa = BuildGauge()
                     .Name("specula_spec_decode_kappa")
                     .Help("kappa = a * depth / k over recent drafting steps (SpecFormer).")
                     .Labels(labels)
                     .Register(*registry)
                     .Add({});
  Gauge& theta =
      BuildGauge()
          .Name("specula_spec_decode_theta")
          .Help("theta = kappa / predicted speedup over recent drafting steps (lower is better).")
          .Labels(labels)
          .Register(*registry)
          .Add({});
  Gauge& draft_share = BuildGauge()
                           .Name("specula_spec_decode_draft_time_share")
                           .Help("Drafters' share of recent step time.")
                           .Labels(labels)
                           .Register(*registry)
                           .Add({});
  Family<Gauge>& acceptance =
      BuildGauge()
          .Name("specula_spec_decode_acceptance_prob")
          .Help("Per drafter, P(position accepted | previous position accepted), recent steps.")
          .Labels(labels)
          .Register(*registry);
  Family<Gauge>& supply =
      BuildGauge()
          .Name("specula_draft_budget_supply")
          .Help(
              "Per drafter, P(node at position comes back | previous node did): budgets the "
              "drafter returned short or empty (n-gram lookup without a match), recent steps.")
          .Labels(labels)
          .Register(*registry);
  Family<Gauge>& streak_shift =
      BuildGauge()
          .Name("specula_draft_budget_streak_shift")
          .Help(
              "Per drafter, what a sequence's last draft (streak: full, partial, rejected) adds to "
              "P(position accepted | previous position accepted) for its next one, as the budget "
              "measured it (0: nothing measured beyond the noise).")
          .Labels(labels)
          .Register(*registry);

  // vLLM V1's per-request histograms (vllm/v1/metrics/loggers.py), same names and buckets.
  Histogram& queue_time = BuildHistogram()
                              .Name("specula_request_queue_time_seconds")
                              .Help("Time from arrival to admission into the engine's batch.")
                              .Labels(labels)
                              .Register(*registry)
                              .Add({}, kRequestLatencyBuckets);
  Histogram& prefill_time = BuildHistogram()
                                .Name("specula_request_prefill_time_seconds")
                                .Help("Time from admission to the first token (prompt prefill).")
                                .Labels(labels)
                                .Register(*registry)
                                .Add({}, kRequestLatencyBuckets);
  Histogram& decode_time = BuildHistogram()
                               .Name("specula_request_decode_time_seconds")
                               .Help("Time from the first token to the last.")
                               .Labels(labels)
                               .Register(*registry)
                               .Add({}, kRequestLatencyBuckets);
  Histogram& inference_time = BuildHistogram()
                                  .Name("specula_request_inference_time_seconds")
                                  .Help("Time from admission to the last token (prefill + decode).")
                                  .Labels(labels)
                                  .Register(*registry)
                                  .Add({}, kRequestLatencyBuckets);
  Histogram& tpot = BuildHistogram()
                        .Name("specula_request_time_per_output_token_seconds")
                        .Help("Per request: decode time / (generated tokens - 1).")
                        .Labels(labels)
                        .Register(*registry)
                        .Add({}, kTpotBuckets);
  Histogram& request_prompt_tokens = BuildHistogram()
                                         .Name("specula_request_prompt_tokens")
                                         .Help("Prompt tokens per finished request.")
                                         .Labels(labels)
                                         .Register(*registry)
                                         .Add({}, token_buckets);
  Histogram& request_generation_tokens = BuildHistogram()
                                             .Name("specula_request_generation_tokens")
                                             .Help("Generated tokens per finished request.")
                                             .Labels(labels)
                                             .Register(*registry)
                                             .Add({}, token_buckets);
  // One sequence per request (vLLM's n = 1): the request's generated tokens.
  Histogram& max_generation_tokens =
      BuildHistogram()
          .Name("specula_request_max_num_generation_tokens")
          .Help("Generated tokens of the request's longest sequence (one sequence per request).")
          .Labels(labels)
          .Register(*registry)
          .Add({}, token_buckets);
  // Admission reserves each request's worst-case KV blocks, so nothing is ever preempted; listed
  // at 0 for dashboards that chart vLLM's preemptions.
  Counter& preemptions = BuildCounter()
                             .Name("specula_num_preemptions_total")
                             .Help(
                                 "Requests preempted from the batch (always 0: admission "
                                 "reserves each request's worst-case KV cache).")
                             .Labels(labels)
                             .Register(*registry)
                             .Add({});
  Histogram& max_tokens = BuildHistogram()
                              .Name("specula_request_params_max_tokens")
                              .Help("The max_new_tokens request parameter.")
                              .Labels(labels)
                              .Register(*registry)
                              .Add({}, token_buckets);
  Histogram& iteration_tokens =
      BuildHistogram()
          .Name("specula_iteration_tokens_total")
          .Help("Tokens per engine step: prompt tokens prefilled plus tokens generated.")
          .Labels(labels)
          .Register(*registry)
          .Add({}, Histogram::BucketBoundaries{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
                                               8192, 16384});
  PositionGauges acceptance_gauges{acceptance};
  PositionGauges supply_gauges{supply};
  PositionGauges streak_shift_gauges{streak_shift};
};

const char* VllmFinishReason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
    case FinishReason::kStopString:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "abort";
    case FinishReason::kError:
      break;
  }
  return "error";
}

RouterMetrics::RouterMetrics(const RouterMetricsOptions& options)
    : impl_(std::make_unique<Impl>(options)) {
  // Before the first step: nothing measured (BudgetSnapshot's defaults).
  impl_->realized_speedup.Set(1);
  impl_->drafting_verdict.Set(-1);
}
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
  impl_->realized_speedup.Set(s.realized_speedup);
  impl_->drafting_verdict.Set(static_cast<double>(s.drafting_verdict));
  impl_->spare_tokens.Set(s.spare_tokens);
  impl_->gap_p99.Set(s.gap_p99_seconds);
  impl_->overrun_p999.Set(s.overrun_p999_seconds);
  impl_->row_price.Set(s.row_price);
  impl_->kappa.Set(s.kappa);
  impl_->theta.Set(s.theta);
  impl_->draft_share.Set(s.draft_share);
  for (const auto& [drafter, p] : s.acceptance) {
    impl_->acceptance_gauges.Set({{"drafter", drafter}}, p);
  }
  for (const auto& [drafter, q] : s.supply) impl_->supply_gauges.Set({{"drafter", drafter}}, q);
  for (const BudgetSnapshot::StreakShift& t : s.streak_shift) {
    impl_->streak_shift_gauges.Set({{"drafter", t.drafter}, {"streak", t.streak}}, t.shift);
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
  add(impl_->draft_errors, after.draft_errors - before.draft_errors);
  for (size_t d = 0; d < after.accepted_per_position.size(); ++d) {
    const int64_t was =
        d < before.accepted_per_position.size() ? before.accepted_per_position[d] : 0;
    if (after.accepted_per_position[d] > was) {
      add(impl_->accepted_per_pos.Add({{"position", std::to_string(d)}}),
          after.accepted_per_position[d] - was);
    }
  }
}

void RouterMetrics::Finished(const FinishedRequest& r) {
  impl_->success
      .Add({{"finished_reason", VllmFinishReason(r.reason)},
            {"specula_reason", FinishReasonName(r.reason)}})
      .Increment();
  impl_->e2e.Observe(r.e2e_seconds);
  impl_->queue_time.Observe(r.queue_seconds);
  if (r.admitted) {
    impl_->prefill_time.Observe(r.prefill_seconds);
    impl_->decode_time.Observe(r.decode_seconds);
    impl_->inference_time.Observe(r.inference_seconds);
  }
  if (r.time_per_output_token() >= 0) impl_->tpot.Observe(r.time_per_output_token());
  impl_->request_prompt_tokens.Observe(static_cast<double>(r.prompt_tokens));
  impl_->request_generation_tokens.Observe(static_cast<double>(r.completion_tokens));
  impl_->max_generation_tokens.Observe(static_cast<double>(r.completion_tokens));
  if (r.max_tokens > 0) impl_->max_tokens.Observe(static_cast<double>(r.max_tokens));
}

void RouterMetrics::IterationTokens(int64_t tokens) {
  impl_->iteration_tokens.Observe(static_cast<double>(tokens));
}

RouterTotals RouterMetrics::Totals() const {
  RouterTotals t;
  t.prompt_tokens = impl_->prompt_tokens.Value();
  t.generation_tokens = impl_->generation_tokens.Value();
  t.finished = static_cast<double>(impl_->e2e.Collect().histogram.sample_count);
  t.drafts = impl_->num_drafts.Value();
  t.draft_tokens = impl_->num_draft_tokens.Value();
  t.accepted_tokens = impl_->num_accepted_tokens.Value();
  t.running = impl_->running.Value();
  t.waiting = impl_->waiting.Value();
  t.kv_cache_usage = impl_->kv_usage.Value();
  return t;
}

void RouterMetrics::SetLoad(int64_t running, int64_t waiting, double kv_cache_usage) {
  impl_->running.Set(static_cast<double>(running));
  impl_->waiting.Set(static_cast<double>(waiting));
  impl_->kv_usage.Set(kv_cache_usage);
}

}  // namespace specula::router
