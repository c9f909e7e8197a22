// services/router/server_log.h: the access-log line, the stats line, and the stats thread.
#include "services/router/server_log.h"

#include <gtest/gtest.h>

#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/util/log.h"

namespace specula::router {
namespace {

TEST(ServerLogTest, AccessLineNamesRequestTokensLatencyDrafterAndFinish) {
  FinishedRequest r{.id = "req-7",
                    .reason = FinishReason::kLength,
                    .drafter = "ngram",
                    .prompt_tokens = 12,
                    .completion_tokens = 5,
                    .max_tokens = 5,
                    .admitted = true,
                    .queue_seconds = 0.0001,
                    .decode_seconds = 0.04,
                    .ttft_seconds = 0.0312,
                    .e2e_seconds = 0.4025};
  r.stats.steps = 2;
  r.stats.accepted_tokens = 3;
  EXPECT_EQ(AccessLogLine(r),
            "request id=req-7 status=OK finish=length prompt_tokens=12 completion_tokens=5 "
            "ttft_ms=31.2 e2e_ms=402.5 queue_ms=0.1 tpot_ms=10.0 drafter=ngram "
            "mean_accepted_len=2.50");
}

TEST(ServerLogTest, AccessLineQuotesClientTextAndNamesErrors) {
  FinishedRequest r{.id = "a b\"\n",
                    .reason = FinishReason::kCancelled,
                    .status = CancelledError("the request was cancelled")};
  const std::string line = AccessLogLine(r);
  EXPECT_NE(line.find("id=\"a b\\\"\\x0a\""), std::string::npos) << line;
  EXPECT_NE(line.find("status=CANCELLED finish=cancelled"), std::string::npos) << line;
  EXPECT_NE(line.find("ttft_ms=- "), std::string::npos) << line;
  EXPECT_NE(line.find("tpot_ms=- drafter=none mean_accepted_len=-"), std::string::npos) << line;
  EXPECT_NE(line.find("error=\"the request was cancelled\""), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

TEST(ServerLogTest, StatsLineHasThroughputLoadKvAndAcceptance) {
  RouterTotals a, b;
  b.prompt_tokens = 100;
  b.generation_tokens = 250;
  b.finished = 3;
  b.running = 2;
  b.waiting = 1;
  b.kv_cache_usage = 0.125;
  b.drafts = 10;
  b.draft_tokens = 40;
  b.accepted_tokens = 15;
  EXPECT_EQ(StatsLogLine(a, b, 10),
            "stats: prompt 10.0 tok/s, generation 25.0 tok/s, finished 3, running 2, waiting 1, "
            "KV cache 12.5%, drafts 10, draft acceptance 37.5%, mean acceptance length 2.50");
  EXPECT_EQ(StatsLogLine(b, b, 10),
            "stats: prompt 0.0 tok/s, generation 0.0 tok/s, finished 0, running 2, waiting 1, "
            "KV cache 12.5%, drafts 0");
}

TEST(ServerLogTest, VllmFinishReasons) {
  EXPECT_STREQ(VllmFinishReason(FinishReason::kStop), "stop");
  EXPECT_STREQ(VllmFinishReason(FinishReason::kStopString), "stop");
  EXPECT_STREQ(VllmFinishReason(FinishReason::kLength), "length");
  EXPECT_STREQ(VllmFinishReason(FinishReason::kCancelled), "abort");
  EXPECT_STREQ(VllmFinishReason(FinishReason::kError), "error");
}

TEST(ServerLogTest, StatsLoggerLogsEachPeriodWhileBusyAndStopsAtOnce) {
  std::mutex mu;
  std::vector<std::string> lines;
  SetLogSink([&](std::string_view line) {
    std::lock_guard<std::mutex> lock(mu);
    lines.emplace_back(line);
  });
  RouterMetrics metrics;
  metrics.SetLoad(1, 0, 0.5);  // busy: a request is running
  {
    StatsLogger logger(&metrics, std::chrono::milliseconds(20));
    for (int i = 0; i < 500; ++i) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (lines.size() >= 2) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  SetLogSink(nullptr);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_GE(lines.size(), 2u);
  EXPECT_NE(lines[0].find(" INFO  stats: "), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("running 1, waiting 0, KV cache 50.0%"), std::string::npos) << lines[0];
}

}  // namespace
}  // namespace specula::router
