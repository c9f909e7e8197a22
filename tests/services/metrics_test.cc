// RouterMetrics: the vLLM-style names, counts that follow what is recorded, and the HTTP endpoint.
#include "services/router/metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "services/router/spec_decode_averages.h"
#include "tests/services/http_get.h"

namespace specula::router {
namespace {

RequestUpdate Drafted(int32_t nodes, int32_t depth, int32_t accepted) {
  RequestUpdate u;
  u.draft_nodes = nodes;
  u.draft_depth = depth;
  u.draft_accepted = accepted;
  return u;
}

// kappa = a * depth / k and theta = kappa / speedup move only on steps that drafted: a step
// without drafts (speedup 1 by definition) used to make theta read as kappa.
TEST(SpecDecodeAveragesTest, KappaAndThetaComeFromDraftingStepsOnly) {
  SpecDecodeAverages averages;
  EXPECT_EQ(averages.kappa(), 0);
  EXPECT_EQ(averages.theta(), 0);
  StepReport drafted;
  // Two sequences: a chain of 4 with 2 accepted (a = 3), a chain of 2 with 1 accepted (a = 2).
  drafted.updates = {Drafted(4, 4, 2), Drafted(2, 2, 1), RequestUpdate{}};
  drafted.draft_seconds = 0.002;
  averages.AddStep(drafted, /*predicted_speedup=*/1.6, /*wall_seconds=*/0.010);
  // a = 2.5 per drafting sequence, depth / k = 6 / 6: the first drafting step seeds the average.
  EXPECT_DOUBLE_EQ(averages.kappa(), 2.5);
  EXPECT_DOUBLE_EQ(averages.theta(), 2.5 / 1.6);
  StepReport plain;
  plain.updates = {RequestUpdate{}, RequestUpdate{}};
  for (int i = 0; i < 50; ++i) averages.AddStep(plain, 1.0, 0.010);
  EXPECT_DOUBLE_EQ(averages.kappa(), 2.5);
  EXPECT_DOUBLE_EQ(averages.theta(), 2.5 / 1.6) << "steps without drafts moved theta";
  // The drafters' share counts every step: it decays once they stop drafting.
  EXPECT_LT(averages.draft_share(), 0.2 * SpecDecodeAverages::kWeight);
  // A tree: 8 nodes of depth 3, 3 accepted (a = 4): kappa_step = 4 * 3 / 8 = 1.5.
  StepReport tree;
  tree.updates = {Drafted(8, 3, 3)};
  averages.AddStep(tree, 2.0, 0.010);
  const double w = SpecDecodeAverages::kWeight;
  EXPECT_DOUBLE_EQ(averages.kappa(), 2.5 + w * (1.5 - 2.5));
  EXPECT_DOUBLE_EQ(averages.theta(), averages.kappa() / (1.6 + w * (2.0 - 1.6)));
}

TEST(RouterMetricsTest, NamesMirrorVllmAndCountsMove) {
  RouterMetrics m;
  const std::string before = m.Text();
  for (const char* name :
       {"specula_spec_decode_num_drafts_total", "specula_spec_decode_num_draft_tokens_total",
        "specula_spec_decode_num_accepted_tokens_total", "specula_spec_decode_draft_errors_total",
        "specula_time_to_first_token_seconds", "specula_inter_token_latency_seconds",
        "specula_e2e_request_latency_seconds", "specula_num_requests_running",
        "specula_num_requests_waiting",
        "specula_request_success_total{finished_reason=\"stop\",specula_reason=\"stop\"} 0",
        "specula_prompt_tokens_total", "specula_generation_tokens_total",
        "specula_kv_cache_usage_perc"}) {
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
  b.draft_errors = 2;
  m.SpecProgress(a, b);
  m.Finished({.reason = FinishReason::kLength, .e2e_seconds = 0.5});
  m.SetLoad(2, 3, 0.25);
  m.Rejected(StatusCode::kInvalidArgument);
  const std::string after = m.Text();
  for (const char* line :
       {"specula_prompt_tokens_total 7", "specula_generation_tokens_total 4",
        "specula_spec_decode_num_drafts_total 1", "specula_spec_decode_num_draft_tokens_total 4",
        "specula_spec_decode_num_accepted_tokens_total 2",
        "specula_spec_decode_draft_errors_total 2",
        "specula_spec_decode_num_accepted_tokens_per_pos_total{position=\"1\"} 1",
        "specula_request_success_total{finished_reason=\"length\",specula_reason=\"length\"} 1",
        "specula_time_to_first_token_seconds_count 1",
        "specula_inter_token_latency_seconds_count 1", "specula_num_requests_running 2",
        "specula_num_requests_waiting 3", "specula_kv_cache_usage_perc 0.25",
        "specula_request_rejected_total{code=\"INVALID_ARGUMENT\"} 1"}) {
    EXPECT_NE(after.find(line), std::string::npos) << line << "\n" << after;
  }
}

// The drafting audit's estimate and verdict (common/spec/drafting_audit.h), as of the last step.
TEST(RouterMetricsTest, DraftBudgetExportsTheAuditsRealizedSpeedupAndVerdict) {
  RouterMetrics m;
  const std::string before = m.Text();
  EXPECT_NE(before.find("specula_draft_budget_realized_speedup 1"), std::string::npos) << before;
  EXPECT_NE(before.find("specula_draft_budget_drafting_verdict -1"), std::string::npos) << before;
  m.DraftBudget({.budgets = {0}, .realized_speedup = 0.93, .drafting_verdict = 0});
  std::string text = m.Text();
  EXPECT_NE(text.find("specula_draft_budget_realized_speedup 0.93"), std::string::npos) << text;
  EXPECT_NE(text.find("specula_draft_budget_drafting_verdict 0"), std::string::npos) << text;
  m.DraftBudget({.budgets = {3}, .realized_speedup = 1.25, .drafting_verdict = 1});
  text = m.Text();
  EXPECT_NE(text.find("specula_draft_budget_realized_speedup 1.25"), std::string::npos) << text;
  EXPECT_NE(text.find("specula_draft_budget_drafting_verdict 1"), std::string::npos) << text;
}

// vLLM V1's per-request histograms, iteration tokens and request_success with vLLM's
// finished_reason values, every series labelled with the model's name.
TEST(RouterMetricsTest, VllmRequestHistogramsAndModelName) {
  RouterMetrics m({.model_name = "tiny", .max_model_len = 128});
  const std::string tiny = "model_name=\"tiny\"";
  const std::string before = m.Text();
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    EXPECT_EQ(SeriesValue(before, "specula_request_success_total",
                          tiny + ",finished_reason=\"" + reason + "\""),
              0)
        << reason << "\n"
        << before;
  }
  // vLLM's build_1_2_5_buckets(max_model_len).
  EXPECT_EQ(SeriesValue(before, "specula_request_prompt_tokens_bucket", tiny + ",le=\"100\""), 0);
  EXPECT_EQ(SeriesValue(before, "specula_request_prompt_tokens_bucket", "le=\"200\""), -1);
  FinishedRequest r{.reason = FinishReason::kStopString,
                    .prompt_tokens = 7,
                    .completion_tokens = 3,
                    .max_tokens = 16,
                    .admitted = true,
                    .queue_seconds = 0.01,
                    .prefill_seconds = 0.02,
                    .decode_seconds = 0.04,
                    .inference_seconds = 0.06,
                    .ttft_seconds = 0.03,
                    .e2e_seconds = 0.07};
  m.Finished(r);
  m.Finished({.reason = FinishReason::kCancelled, .queue_seconds = 0.5, .e2e_seconds = 0.5});
  m.IterationTokens(9);
  m.Admitted(7, false);
  const std::string after = m.Text();
  const std::vector<std::pair<std::string, double>> expected = {
      {"specula_request_queue_time_seconds_count", 2},
      {"specula_request_prefill_time_seconds_count", 1},
      {"specula_request_decode_time_seconds_count", 1},
      {"specula_request_inference_time_seconds_count", 1},
      {"specula_request_time_per_output_token_seconds_sum", 0.02},
      {"specula_request_time_per_output_token_seconds_count", 1},
      {"specula_request_prompt_tokens_sum", 7},
      {"specula_request_generation_tokens_sum", 3},
      {"specula_request_max_num_generation_tokens_sum", 3},
      {"specula_request_params_max_tokens_count", 1},
      {"specula_iteration_tokens_total_sum", 9},
      {"specula_e2e_request_latency_seconds_count", 2},
      {"specula_prompt_tokens_total", 7},
      {"specula_num_preemptions_total", 0}};
  for (const auto& [name, value] : expected) {
    EXPECT_DOUBLE_EQ(SeriesValue(after, name, tiny), value) << name << "\n" << after;
  }
  EXPECT_EQ(SeriesValue(after, "specula_request_success_total",
                        tiny + ",finished_reason=\"stop\",specula_reason=\"stop_string\""),
            1);
  EXPECT_EQ(SeriesValue(after, "specula_request_success_total",
                        tiny + ",finished_reason=\"abort\",specula_reason=\"cancelled\""),
            1);
  const RouterTotals t = m.Totals();
  EXPECT_EQ(t.prompt_tokens, 7);
  EXPECT_EQ(t.finished, 2);
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

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

// Issue 19.6: the endpoint served one connection at a time, so a client that connected and sent
// nothing, or trickled bytes, blocked every scrape.
TEST(RouterMetricsTest, IdleAndTricklingConnectionsDoNotBlockScrapes) {
  RouterMetrics m;
  auto port = m.Expose("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  const int idle = Connect(*port);  // sends nothing
  const int trickle = Connect(*port);
  std::atomic<bool> scraped{false};
  std::atomic<bool> gave_up{false};
  std::thread trickler([&] {
    // One byte at a time, well inside any per-read timeout, for up to 30 s.
    const std::string request = "GET /metrics HTTP/1.0\r\nX-Slow: ";
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (size_t i = 0; !scraped; ++i) {
      if (std::chrono::steady_clock::now() > end) {
        gave_up = true;
        return;
      }
      const char c = i < request.size() ? request[i] : 'x';
      (void)!send(trickle, &c, 1, MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both are accepted first
  HttpResponse ok = HttpGet(*port, "/metrics");
  scraped = true;
  trickler.join();
  EXPECT_EQ(ok.status, 200);
  EXPECT_FALSE(gave_up) << "the scrape waited for the trickling client";
  close(idle);
  close(trickle);
  // Many idle connections at once: past the cap they are refused, and a scrape still succeeds
  // once they go.
  std::vector<int> many;
  for (int i = 0; i < 40; ++i) many.push_back(Connect(*port));
  for (int fd : many) close(fd);
  HttpResponse after;
  for (int i = 0; i < 100 && after.status != 200; ++i) {
    after = HttpGet(*port, "/metrics");
    if (after.status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(after.status, 200);
}

}  // namespace
}  // namespace specula::router
