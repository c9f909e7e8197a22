// Process metrics under the names every Prometheus client library exports (process_cpu_seconds_
// total, process_resident_memory_bytes, ...), so dashboards built for vLLM or any Python/Go server
// chart Specula's router, target and drafter processes too. Read from /proc at each scrape.
#pragma once

#include <vector>

namespace prometheus {
struct MetricFamily;
}

namespace specula::services {

// This process's families: CPU seconds, resident and virtual memory, start time, open and
// maximum file descriptors. Families whose source cannot be read (no /proc) are left out.
std::vector<prometheus::MetricFamily> CollectProcessMetrics();

}  // namespace specula::services
