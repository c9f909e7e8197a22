#include "services/common/metrics_process.h"

#include <prometheus/metric_family.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace specula::services {
namespace {

prometheus::MetricFamily Family(const char* name, const char* help, prometheus::MetricType type,
                                double value) {
  prometheus::MetricFamily family{name, help, type, {}};
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(metric);
  return family;
}

// Boot time in seconds since the epoch (/proc/stat's btime), 0 if unknown.
double BootTime() {
  std::ifstream in("/proc/stat");
  std::string key;
  while (in >> key) {
    if (key == "btime") {
      double btime = 0;
      in >> btime;
      return btime;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

}  // namespace

std::vector<prometheus::MetricFamily> CollectProcessMetrics() {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> families;
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  // The command name (field 2) is in parentheses and may hold spaces: fields restart after ')'.
  const size_t paren = stat.rfind(')');
  if (paren != std::string::npos) {
    std::istringstream fields(stat.substr(paren + 2));
    std::string field[22];  // fields 3..24: state .. rss
    for (auto& f : field) fields >> f;
    if (fields) {
      const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
      const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
      const double utime = std::stod(field[14 - 3]), stime = std::stod(field[15 - 3]);
      families.push_back(Family("process_cpu_seconds_total",
                                "Total user and system CPU time spent in seconds.",
                                MetricType::Counter, (utime + stime) / ticks));
      families.push_back(Family("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                                MetricType::Gauge, std::stod(field[23 - 3])));
      families.push_back(Family("process_resident_memory_bytes", "Resident memory size in bytes.",
                                MetricType::Gauge, std::stod(field[24 - 3]) * page));
      if (const double boot = BootTime(); boot > 0) {
        families.push_back(Family("process_start_time_seconds",
                                  "Start time of the process since unix epoch in seconds.",
                                  MetricType::Gauge, boot + std::stod(field[22 - 3]) / ticks));
      }
    }
  }
  std::error_code error;
  double fds = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", error), end; !error && it != end;
       it.increment(error)) {
    ++fds;
  }
  if (!error) {
    families.push_back(
        Family("process_open_fds", "Number of open file descriptors.", MetricType::Gauge, fds));
  }
  if (rlimit limit; getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    families.push_back(Family("process_max_fds", "Maximum number of open file descriptors.",
                              MetricType::Gauge, static_cast<double>(limit.rlim_cur)));
  }
  return families;
}

}  // namespace specula::services
