#include "services/drafter/drafter_metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace specula::drafter {

struct DrafterMetrics::Impl {
  explicit Impl(prometheus::Registry& r)
      : calls(prometheus::BuildCounter()
                  .Name("specula_drafter_calls_total")
                  .Help("Drafter service calls by drafter, kind and status code.")
                  .Register(r)),
        seconds(prometheus::BuildHistogram()
                    .Name("specula_drafter_call_duration_seconds")
                    .Help("Time to handle one call (validation, the drafter's work, encoding).")
                    .Register(r)),
        sequences(prometheus::BuildGauge()
                      .Name("specula_drafter_sequences")
                      .Help("Sequences whose drafter state this server holds.")
                      .Register(r)
                      .Add({})) {}

  prometheus::Family<prometheus::Counter>& calls;
  prometheus::Family<prometheus::Histogram>& seconds;
  prometheus::Gauge& sequences;
};

DrafterMetrics::DrafterMetrics() : impl_(std::make_unique<Impl>(registry_.registry())) {}
DrafterMetrics::~DrafterMetrics() = default;

void DrafterMetrics::Call(const std::string& drafter, const std::string& call,
                          const std::string& code, double seconds) {
  impl_->calls.Add({{"drafter", drafter}, {"call", call}, {"code", code}}).Increment();
  impl_->seconds
      .Add({{"drafter", drafter}, {"call", call}},
           prometheus::Histogram::BucketBoundaries{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                   0.01, 0.025, 0.05, 0.1, 0.25})
      .Observe(seconds);
}

void DrafterMetrics::SetSequences(int64_t sequences) {
  impl_->sequences.Set(static_cast<double>(sequences));
}

}  // namespace specula::drafter
