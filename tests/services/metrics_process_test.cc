#include "services/common/metrics_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <prometheus/metric_family.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <string>

#include "services/common/metrics_registry.h"

namespace specula::services {
namespace {

std::map<std::string, double> Values() {
  std::map<std::string, double> values;
  for (const auto& family : CollectProcessMetrics()) {
    EXPECT_EQ(family.metric.size(), 1u) << family.name;
    const auto& metric = family.metric.at(0);
    values[family.name] =
        family.type == prometheus::MetricType::Counter ? metric.counter.value : metric.gauge.value;
  }
  return values;
}

TEST(ProcessMetricsTest, ReportsThisProcess) {
  // Burn some CPU so the counter has something to count.
  volatile double sink = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
  while (std::chrono::steady_clock::now() < until) sink = sink + 1;

  const auto values = Values();
  for (const char* name : {"process_cpu_seconds_total", "process_virtual_memory_bytes",
                           "process_resident_memory_bytes", "process_start_time_seconds",
                           "process_open_fds", "process_max_fds"}) {
    EXPECT_TRUE(values.count(name)) << name;
  }
  EXPECT_GE(values.at("process_cpu_seconds_total"), 0.05);
  EXPECT_GT(values.at("process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(values.at("process_virtual_memory_bytes"), values.at("process_resident_memory_bytes"));
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_LE(values.at("process_start_time_seconds"), now + 1);
  EXPECT_GT(values.at("process_start_time_seconds"), now - 3600);
  EXPECT_GE(values.at("process_max_fds"), values.at("process_open_fds"));
}

TEST(ProcessMetricsTest, CountsOpenFileDescriptors) {
  const double before = Values().at("process_open_fds");
  const int fd = open("/dev/null", O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(Values().at("process_open_fds"), before + 1);
  close(fd);
  EXPECT_EQ(Values().at("process_open_fds"), before);
}

TEST(ProcessMetricsTest, ScrapedWithTheRegistry) {
  MetricsRegistry registry;
  const std::string text = registry.Text();
  EXPECT_NE(text.find("# TYPE process_cpu_seconds_total counter\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nprocess_resident_memory_bytes "), std::string::npos) << text;
}

}  // namespace
}  // namespace specula::services
