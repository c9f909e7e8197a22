#include "services/common/metrics_registry.h"

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include "services/common/metrics_endpoint.h"

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
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace specula::services
