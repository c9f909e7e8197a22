#include "loadgen/arrivals.h"

#include <algorithm>
#include <cmath>

namespace specula::loadgen {
namespace {

bool AllAtOnce(double rate) { return rate <= 0 || std::isinf(rate); }

}  // namespace

Status ValidateArrivals(const ArrivalOptions& o) {
  if (!(o.burstiness > 0)) {
    return InvalidArgumentError(StrCat("--burstiness must be positive, got ", o.burstiness));
  }
  if (o.request_rate < 0 || std::isnan(o.request_rate)) {
    return InvalidArgumentError(
        StrCat("--request-rate must be >= 0 (0 or inf = all at once), got ", o.request_rate));
  }
  if (o.ramp_up_strategy.empty()) return OkStatus();
  if (o.ramp_up_strategy != "linear") {
    return InvalidArgumentError(
        StrCat("--ramp-up-strategy: '", o.ramp_up_strategy, "' is not supported (linear)"));
  }
  if (o.ramp_up_start_rps < 0 || o.ramp_up_end_rps <= 0) {
    return InvalidArgumentError(
        "--ramp-up-strategy linear needs --ramp-up-start-rps >= 0 and --ramp-up-end-rps > 0");
  }
  if (o.ramp_up_start_rps > o.ramp_up_end_rps) {
    return InvalidArgumentError(StrCat("--ramp-up-start-rps (", o.ramp_up_start_rps,
                                       ") must not exceed --ramp-up-end-rps (", o.ramp_up_end_rps,
                                       ")"));
  }
  if (o.request_rate > 0 && !std::isinf(o.request_rate)) {
    return InvalidArgumentError(
        "--request-rate and --ramp-up-strategy exclude each other: the ramp sets the rate");
  }
  return OkStatus();
}

double CurrentRequestRate(const ArrivalOptions& o, int64_t index, int64_t total) {
  if (o.ramp_up_strategy != "linear") return o.request_rate;
  const double progress =
      static_cast<double>(index) / static_cast<double>(std::max<int64_t>(total - 1, 1));
  return o.ramp_up_start_rps + (o.ramp_up_end_rps - o.ramp_up_start_rps) * progress;
}

double SampleInterval(double rate, double burstiness, std::mt19937_64& rng) {
  if (AllAtOnce(rate)) return 0;
  if (std::isinf(burstiness)) return 1.0 / rate;
  std::gamma_distribution<double> gamma(burstiness, 1.0 / (rate * burstiness));
  return gamma(rng);
}

std::vector<double> ArrivalTimes(int64_t n, const ArrivalOptions& o) {
  std::vector<double> times(static_cast<size_t>(std::max<int64_t>(n, 0)), 0.0);
  if (times.empty()) return times;
  const bool ramp = o.ramp_up_strategy == "linear";
  if (!ramp && AllAtOnce(o.request_rate)) return times;
  std::mt19937_64 rng(o.seed);
  double t = 0;
  for (int64_t i = 0; i < n; ++i) {
    double rate = CurrentRequestRate(o, i, n);
    // A ramp starting at 0 requests/s sends its first request at once (vLLM asserts rate > 0).
    t += rate > 0 ? SampleInterval(rate, o.burstiness, rng) : 0;
    times[static_cast<size_t>(i)] = t;
  }
  if (!ramp && times.back() > 0) {
    const double scale = static_cast<double>(n) / o.request_rate / times.back();
    for (double& v : times) v *= scale;
  }
  return times;
}

}  // namespace specula::loadgen
