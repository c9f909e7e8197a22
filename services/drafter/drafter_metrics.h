// The drafter server's Prometheus metrics: calls by kind and outcome, their latency, and the
// sequences whose state it holds.
#pragma once

#include <memory>
#include <string>

#include "services/common/metrics_registry.h"

namespace specula::drafter {

class DrafterMetrics {
 public:
  DrafterMetrics();
  ~DrafterMetrics();

  services::MetricsRegistry& registry() { return registry_; }
  // `call` is add, release, observe or propose; `code` the reply's status code name.
  void Call(const std::string& drafter, const std::string& call, const std::string& code,
            double seconds);
  void SetSequences(int64_t sequences);

 private:
  struct Impl;
  services::MetricsRegistry registry_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace specula::drafter
