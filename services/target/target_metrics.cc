#include "services/target/target_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace specula::target {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Counter;
using prometheus::Gauge;
using prometheus::Histogram;

struct TargetMetrics::Impl {
  explicit Impl(prometheus::Registry& r)
      : sessions(BuildCounter()
                     .Name("specula_target_sessions_total")
                     .Help("Router sessions opened (Target.Run streams).")
                     .Register(r)
                     .Add({})),
        steps(BuildCounter()
                  .Name("specula_target_steps_total")
                  .Help("Engine steps run (one target forward each).")
                  .Register(r)
                  .Add({})),
        step_seconds(
            BuildHistogram()
                .Name("specula_target_step_duration_seconds")
                .Help("One engine step inside the target: drafting, forward, verification.")
                .Register(r)
                .Add({}, Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08,
                                                     0.16, 0.32, 0.64, 1.28, 2.56})),
        draft_seconds(BuildCounter()
                          .Name("specula_target_draft_seconds_total")
                          .Help("Time in drafter calls (the drafter service's round trips).")
                          .Register(r)
                          .Add({})),
        verify_seconds(BuildCounter()
                           .Name("specula_target_verify_seconds_total")
                           .Help("Time in the target forward, verification and KV commit.")
                           .Register(r)
                           .Add({})),
        prefill_tokens(BuildCounter()
                           .Name("specula_target_prefill_tokens_total")
                           .Help("Prompt tokens prefilled.")
                           .Register(r)
                           .Add({})),
        verify_tokens(BuildCounter()
                          .Name("specula_target_verify_tokens_total")
                          .Help("Tokens in verification forwards (pending tokens + draft trees).")
                          .Register(r)
                          .Add({})),
        batch_size(BuildHistogram()
                       .Name("specula_target_batch_size")
                       .Help("Sequences in one step's forward.")
                       .Register(r)
                       .Add({}, Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128, 256})),
        running(BuildGauge()
                    .Name("specula_num_requests_running")
                    .Help("Requests in the target's batch.")
                    .Register(r)
                    .Add({})),
        kv_usage(BuildGauge()
                     .Name("specula_kv_cache_usage_perc")
                     .Help("Share of the KV cache's blocks in use (0..1).")
                     .Register(r)
                     .Add({})) {}

  Counter& sessions;
  Counter& steps;
  Histogram& step_seconds;
  Counter& draft_seconds;
  Counter& verify_seconds;
  Counter& prefill_tokens;
  Counter& verify_tokens;
  Histogram& batch_size;
  Gauge& running;
  Gauge& kv_usage;
};

TargetMetrics::TargetMetrics() : impl_(std::make_unique<Impl>(registry_.registry())) {}
TargetMetrics::~TargetMetrics() = default;

void TargetMetrics::SessionStarted() { impl_->sessions.Increment(); }

void TargetMetrics::Step(const StepOutcome& outcome, int32_t running, double kv_cache_usage) {
  const StepReport& r = outcome.report;
  impl_->steps.Increment();
  impl_->step_seconds.Observe(outcome.step_seconds);
  impl_->draft_seconds.Increment(r.draft_seconds);
  impl_->verify_seconds.Increment(r.verify_seconds);
  impl_->prefill_tokens.Increment(static_cast<double>(r.prefill_tokens));
  impl_->verify_tokens.Increment(static_cast<double>(r.verify_tokens));
  if (r.batch_size > 0) impl_->batch_size.Observe(r.batch_size);
  Load(running, kv_cache_usage);
}

void TargetMetrics::Load(int32_t running, double kv_cache_usage) {
  impl_->running.Set(running);
  impl_->kv_usage.Set(kv_cache_usage);
}

}  // namespace specula::target
