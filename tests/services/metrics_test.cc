// RouterMetrics: the vLLM-style names, counts that follow what is recorded, and the HTTP endpoint.
#include "services/router/metrics.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/services/http_get.h"

namespace specula::router {
namespace {

TEST(RouterMetricsTest, NamesMirrorVllmAndCountsMove) {
  RouterMetrics m;
  const std::string before = m.Text();
  for (const char* name :
       {"specula_spec_decode_num_drafts_total", "specula_spec_decode_num_draft_tokens_total",
        "specula_spec_decode_num_accepted_tokens_total", "specula_time_to_first_token_seconds",
        "specula_inter_token_latency_seconds", "specula_e2e_request_latency_seconds",
        "specula_num_requests_running", "specula_num_requests_waiting",
        "specula_request_success_total{finished_reason=\"stop\"} 0", "specula_prompt_tokens_total",
        "specula_generation_tokens_total", "specula_kv_cache_usage_perc"}) {
    EXPECT_NE(before.find(name), std::string::npos) << name;
  }
  m.Admitted(7, /*lossy=*/false);
  m.TokensDelivered(1, /*first=*/true, 0.02);
  m.TokensDelivered(3, /*first=*/false, 0.01);
  SpecRequestStats a, b;
  b.draft_steps = 1;
  b.draft_tokens = 4;
  b.accepted_tokens = 2;
  b.accepted_per_position = {1, 1, 0, 0};
  m.SpecProgress(a, b);
  m.Finished(FinishReason::kLength, 0.5);
  m.SetLoad(2, 3, 0.25);
  m.Rejected(StatusCode::kInvalidArgument);
  const std::string after = m.Text();
  for (const char* line :
       {"specula_prompt_tokens_total 7", "specula_generation_tokens_total 4",
        "specula_spec_decode_num_drafts_total 1", "specula_spec_decode_num_draft_tokens_total 4",
        "specula_spec_decode_num_accepted_tokens_total 2",
        "specula_spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"} 1",
        "specula_request_success_total{finished_reason=\"length\"} 1",
        "specula_time_to_first_token_seconds_count 1",
        "specula_inter_token_latency_seconds_count 1", "specula_num_requests_running 2",
        "specula_num_requests_waiting 3", "specula_kv_cache_usage_perc 0.25",
        "specula_request_rejected_total{code=\"INVALID_ARGUMENT\"} 1"}) {
    EXPECT_NE(after.find(line), std::string::npos) << line << "\n" << after;
  }
}

TEST(RouterMetricsTest, ServesMetricsOverHttp) {
  RouterMetrics m;
  auto port = m.Expose("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  ASSERT_GT(*port, 0);
  m.Admitted(5, false);
  HttpResponse ok = HttpGet(*port, "/metrics");
  EXPECT_EQ(ok.status, 200);
  EXPECT_NE(ok.body.find("specula_prompt_tokens_total 5"), std::string::npos) << ok.body;
  EXPECT_EQ(HttpGet(*port, "/").status, 404);
  EXPECT_EQ(HttpGet(*port, "/metrics?x=1").status, 200);
  // The port is taken now: a second endpoint on it fails with a clear error.
  RouterMetrics other;
  auto taken = other.Expose("127.0.0.1", *port);
  ASSERT_FALSE(taken.ok());
  EXPECT_EQ(taken.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(taken.status().message().find("--metrics-port"), std::string::npos);
}

}  // namespace
}  // namespace specula::router
