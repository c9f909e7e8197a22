// The router's log lines (common/util/log.h: timestamp, level, stderr): an access-log line per
// finished request and a periodic stats line.
//
//   ... INFO  request id=req-7 status=OK finish=length prompt_tokens=12 completion_tokens=64
//             ttft_ms=31.2 e2e_ms=402.5 queue_ms=0.1 tpot_ms=5.9 drafter=ngram
//             mean_accepted_len=2.41
//   ... INFO  stats: prompt 120.0 tok/s, generation 610.4 tok/s, running 3, waiting 0, KV cache
//             4.2%, drafts 210, draft acceptance 61.5%, mean acceptance length 2.85
//
// (one line each). The stats line mirrors vLLM's LoggingStatLogger: throughput over the last
// period from the Prometheus counters, the load gauges, and speculation over the period; it drops
// to DEBUG while the server is idle, so idle servers keep quiet at the default level.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "services/router/metrics.h"

namespace specula::router {

// The access-log line of one finished request (without timestamp and level). A value with
// spaces, quotes or control characters (the client chooses its request id) is quoted and escaped,
// so a line stays one line.
std::string AccessLogLine(const FinishedRequest& request);

// The stats line for the period between two totals `seconds` apart.
std::string StatsLogLine(const RouterTotals& before, const RouterTotals& now, double seconds);

// Logs StatsLogLine every `period` on its own thread until destruction.
class StatsLogger {
 public:
  StatsLogger(const RouterMetrics* metrics, std::chrono::milliseconds period);
  ~StatsLogger();  // stops the thread (at once, not after a period)
  StatsLogger(const StatsLogger&) = delete;
  StatsLogger& operator=(const StatsLogger&) = delete;

 private:
  void Run();

  const RouterMetrics* metrics_;
  const std::chrono::milliseconds period_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace specula::router
