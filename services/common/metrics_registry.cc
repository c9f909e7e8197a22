#include "services/common/metrics_registry.h"

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "services/common/metrics_endpoint.h"
#include "services/common/metrics_process.h"

namespace specula::services {

MetricsRegistry::MetricsRegistry() : registry_(std::make_shared<prometheus::Registry>()) {}

MetricsRegistry::~MetricsRegistry() { endpoint_.reset(); }

StatusOr<int> MetricsRegistry::Expose(const std::string& host, int port) {
  if (endpoint_) return FailedPreconditionError("metrics are already exposed");
  auto endpoint = MetricsEndpoint::Start(host, port, [this] { return Text(); });
  if (!endpoint.ok()) return endpoint.status().WithContext("--metrics-port");
  endpoint_ = std::move(*endpoint);
  return endpoint_->port();
}

std::string MetricsRegistry::Text() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (auto& family : CollectProcessMetrics()) families.push_back(std::move(family));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace specula::services
