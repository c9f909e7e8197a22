// The target server's Prometheus metrics: engine steps, their batch and draft/verify time split,
// and KV cache load, as the verifier sees them (the router's metrics cover requests and latency).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/spec/target_backend.h"
#include "services/common/metrics_registry.h"

namespace specula::target {

class TargetMetrics {
 public:
  TargetMetrics();
  ~TargetMetrics();

  services::MetricsRegistry& registry() { return registry_; }
  void SessionStarted();
  // One engine step; sets the load gauges as Load does.
  void Step(const StepOutcome& outcome, int32_t running, double kv_cache_usage);
  // The load gauges alone (after a session ended and its requests were freed).
  void Load(int32_t running, double kv_cache_usage);

 private:
  struct Impl;
  services::MetricsRegistry registry_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specula::target
