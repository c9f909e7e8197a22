// When each request of a run is sent: `vllm bench serve`'s arrival process. Intervals between
// requests are gamma-distributed with shape = burstiness and mean 1 / rate (burstiness 1 is a
// Poisson process; < 1 burstier, > 1 more uniform, infinity a constant interval), at a fixed rate
// or a rate ramped linearly from a start to an end value over the run. Torch-free and gRPC-free.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/util/status.h"

namespace specula::loadgen {

struct ArrivalOptions {
  // Requests per second; 0 or infinity = every request at time 0 (then only the concurrency cap
  // paces them). Ignored with a ramp-up.
  double request_rate = 0;
  // Gamma shape of the intervals, > 0; infinity = constant intervals.
  double burstiness = 1.0;
  // "" (fixed rate) or "linear": request i of n is sent at rate
  // start + (end - start) * i / (n - 1).
  std::string ramp_up_strategy;
  double ramp_up_start_rps = 0;
  double ramp_up_end_rps = 0;
  uint64_t seed = 0;
};

// INVALID_ARGUMENT naming the flag (--burstiness, --ramp-up-*) for settings vLLM also rejects.
Status ValidateArrivals(const ArrivalOptions& options);

// The rate request `index` of `total` is sent at (vLLM's _get_current_request_rate).
double CurrentRequestRate(const ArrivalOptions& options, int64_t index, int64_t total);

// One gamma interval (seconds) at `rate` requests/s: shape = burstiness, scale =
// 1 / (rate * burstiness), so mean 1 / rate and variance 1 / (rate^2 * burstiness).
double SampleInterval(double rate, double burstiness, std::mt19937_64& rng);

// Send times in seconds from the start of the run, one per request, non-decreasing. As in vLLM,
// request i waits the sum of i + 1 intervals; at a fixed rate the times are rescaled so the last
// one is exactly n / rate (so throughput does not drift with the seed). All zero when the rate is
// 0 or infinite. Call ValidateArrivals first.
std::vector<double> ArrivalTimes(int64_t n, const ArrivalOptions& options);

}  // namespace specula::loadgen
