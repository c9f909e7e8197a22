// A Prometheus registry with its /metrics endpoint: what every server's metrics class (router,
// target, drafter) builds its counters, gauges and histograms on. Metrics are thread-safe;
// scrapes run on the endpoint's own thread.
#pragma once

#include <memory>
#include <string>

#include "common/util/status.h"

namespace prometheus {
class Registry;
}

namespace specula::services {

class MetricsEndpoint;

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();  // stops the endpoint before the registry goes
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  prometheus::Registry& registry() { return *registry_; }
  // Serves GET /metrics on host:port (0 = any free port) until destruction; returns the bound
  // port. UNAVAILABLE if it cannot bind; at most once.
  StatusOr<int> Expose(const std::string& host, int port);
  // Every metric in Prometheus text format, as /metrics returns it, with the process_* metrics
  // (metrics_process.h) after the registry's own.
  std::string Text() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<MetricsEndpoint> endpoint_;
};

}  // namespace specula::services
