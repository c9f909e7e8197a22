// loadgen/load_report.h: percentiles as numpy computes them, vLLM's result keys (configurable
// percentiles and metrics, per-request lists, goodput null without SLOs), the speculation fields,
// and the flag parsers' errors.
#include "loadgen/load_report.h"

#include <gtest/gtest.h>

namespace specula::loadgen {
namespace {

RequestRecord Ok(double ttft_s, double e2e_s, int64_t tokens, std::vector<double> itl_s) {
  RequestRecord r;
  r.ok = true;
  r.prompt_tokens = 10;
  r.output_tokens = tokens;
  r.ttft_s = ttft_s;
  r.e2e_s = e2e_s;
  r.itl_s = std::move(itl_s);
  r.text = "out";
  return r;
}

TEST(LoadReportTest, PercentileInterpolatesLikeNumpy) {
  // numpy.percentile([1, 2, 3, 4], p): 50 -> 2.5, 99 -> 3.97, 0 -> 1, 100 -> 4.
  const std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 2.5);
  EXPECT_NEAR(Percentile(v, 99), 3.97, 1e-12);
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(Percentile({7}, 99), 7);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
}

TEST(LoadReportTest, PercentileWordsAreVllms) {
  EXPECT_EQ(PercentileWord(99), "99");
  EXPECT_EQ(PercentileWord(50), "50");
  EXPECT_EQ(PercentileWord(99.9), "99.9");
  EXPECT_EQ(PercentileWord(12.5), "12.5");
}

TEST(LoadReportTest, ResultHasVllmKeysAndPerRequestLists) {
  RequestRecord failed;
  failed.prompt_tokens = 4;
  failed.error = "14: unavailable";
  failed.finish_reason = "length";  // ignored: failed requests have no finish reason
  std::vector<RequestRecord> records = {Ok(0.1, 0.5, 5, {0.1, 0.1, 0.1, 0.1}), failed,
                                        Ok(0.2, 0.2, 1, {})};
  records[0].finish_reason = "stop_string";
  records[2].finish_reason = "length";
  const nlohmann::json r = Summarize(records, 2.0, ReportOptions());
  for (const char* key : {"duration",
                          "completed",
                          "failed",
                          "total_input_tokens",
                          "total_output_tokens",
                          "request_throughput",
                          "request_goodput",
                          "output_throughput",
                          "total_token_throughput",
                          "input_lens",
                          "output_lens",
                          "ttfts",
                          "itls",
                          "generated_texts",
                          "errors",
                          "mean_ttft_ms",
                          "median_ttft_ms",
                          "std_ttft_ms",
                          "p99_ttft_ms",
                          "mean_tpot_ms",
                          "median_tpot_ms",
                          "std_tpot_ms",
                          "p99_tpot_ms",
                          "mean_itl_ms",
                          "median_itl_ms",
                          "std_itl_ms",
                          "p99_itl_ms",
                          "mean_token_itl_ms",
                          "median_token_itl_ms",
                          "std_token_itl_ms",
                          "itl_tokens",
                          "mean_e2el_ms",
                          "median_e2el_ms",
                          "std_e2el_ms",
                          "num_drafts",
                          "draft_tokens",
                          "accepted_tokens",
                          "acceptance_rate",
                          "mean_accepted_len",
                          "accepted_per_position",
                          "acceptance_rate_per_position"}) {
    EXPECT_TRUE(r.contains(key)) << key;
  }
  // e2el is not a default percentile metric (vLLM: ttft,tpot,itl).
  EXPECT_FALSE(r.contains("p99_e2el_ms"));
  EXPECT_TRUE(r["request_goodput"].is_null());
  EXPECT_EQ(r["completed"], 2);
  EXPECT_EQ(r["failed"], 1);
  EXPECT_EQ(r["total_input_tokens"], 20);
  EXPECT_EQ(r["total_output_tokens"], 6);
  EXPECT_DOUBLE_EQ(r["request_throughput"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(r["output_throughput"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(r["total_token_throughput"].get<double>(), 13.0);
  EXPECT_EQ(r["input_lens"], nlohmann::json({10, 4, 10}));
  EXPECT_EQ(r["output_lens"], nlohmann::json({5, 0, 1}));
  EXPECT_EQ(r["ttfts"], nlohmann::json({0.1, 0.0, 0.2}));  // seconds, as vLLM
  EXPECT_EQ(r["itls"][0].size(), 4u);
  EXPECT_EQ(r["itls"][1].size(), 0u);
  EXPECT_EQ(r["errors"], nlohmann::json({"", "14: unavailable", ""}));
  EXPECT_EQ(r["finish_reasons"], nlohmann::json({"stop_string", "", "length"}));
  EXPECT_EQ(r["generated_texts"][0], "out");
  EXPECT_NEAR(r["mean_ttft_ms"].get<double>(), 150, 1e-9);
  // TPOT: (0.5 - 0.1) / 4 s for the first request; the one-token request has none.
  EXPECT_NEAR(r["mean_tpot_ms"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(r["mean_itl_ms"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(r["median_e2el_ms"].get<double>(), 350, 1e-9);
}

TEST(LoadReportTest, ChosenPercentilesAndMetricsMakeTheKeys) {
  ReportOptions o;
  o.percentiles = {50, 90, 99.9};
  o.percentile_metrics = {"ttft", "e2el"};
  const nlohmann::json r = Summarize({Ok(0.1, 0.5, 5, {0.1})}, 1.0, o);
  for (const char* key : {"p50_ttft_ms", "p90_ttft_ms", "p99.9_ttft_ms", "p50_e2el_ms",
                          "p90_e2el_ms", "p99.9_e2el_ms"}) {
    EXPECT_TRUE(r.contains(key)) << key;
  }
  EXPECT_FALSE(r.contains("p99_ttft_ms"));
  EXPECT_FALSE(r.contains("p50_itl_ms"));
  EXPECT_TRUE(r.contains("mean_itl_ms"));  // mean/median/std are always there
}

TEST(LoadReportTest, TokenItlSplitsEachChunksGapOverItsTokens) {
  // One request streams 1 token after 10 ms, 3 tokens after 30 ms, 2 after 8 ms; another has no
  // chunk sizes (one token per gap) and one 10 ms gap.
  RequestRecord spec = Ok(0.1, 0.2, 7, {0.010, 0.030, 0.008});
  spec.itl_tokens = {1, 3, 2};
  RequestRecord plain = Ok(0.1, 0.2, 2, {0.010});
  ReportOptions o;
  o.percentile_metrics = {"itl", "token_itl"};
  o.percentiles = {50, 100};
  const nlohmann::json r = Summarize({spec, plain}, 1.0, o);
  // itl: one gap per chunk {10, 30, 8, 10}; token_itl: {10, 10, 10, 10, 4, 4, 10}.
  EXPECT_NEAR(r["mean_itl_ms"].get<double>(), 14.5, 1e-9);
  EXPECT_NEAR(r["p100_itl_ms"].get<double>(), 30, 1e-9);
  EXPECT_NEAR(r["mean_token_itl_ms"].get<double>(), 58.0 / 7, 1e-9);
  EXPECT_NEAR(r["median_token_itl_ms"].get<double>(), 10, 1e-9);
  EXPECT_NEAR(r["p100_token_itl_ms"].get<double>(), 10, 1e-9);
  EXPECT_NEAR(r["p50_token_itl_ms"].get<double>(), 10, 1e-9);
  EXPECT_EQ(r["itl_tokens"], nlohmann::json({{1, 3, 2}, nlohmann::json::array()}));
  // Without percentiles chosen for it, token_itl still has mean/median/std.
  const nlohmann::json d = Summarize({spec}, 1.0, ReportOptions());
  EXPECT_TRUE(d.contains("std_token_itl_ms"));
  EXPECT_FALSE(d.contains("p99_token_itl_ms"));
}

TEST(LoadReportTest, GoodputCountsRequestsMeetingEverySlo) {
  const std::vector<RequestRecord> records = {
      Ok(0.1, 0.5, 5, {}),  // TTFT 100 ms, TPOT 100 ms
      Ok(0.3, 0.7, 5, {}),  // TTFT 300 ms, TPOT 100 ms
      Ok(0.1, 2.1, 5, {}),  // TTFT 100 ms, TPOT 500 ms
      Ok(0.1, 0.1, 1, {}),  // one token: TPOT counts as 0
  };
  ReportOptions o;
  o.goodput = {{"ttft", 200}, {"tpot", 150}};
  EXPECT_DOUBLE_EQ(Summarize(records, 2.0, o)["request_goodput"].get<double>(), 1.0);
  o.goodput = {{"e2el", 600}};
  EXPECT_DOUBLE_EQ(Summarize(records, 1.0, o)["request_goodput"].get<double>(), 2.0);
}

TEST(LoadReportTest, SpeculationFieldsSumOverRequests) {
  RequestRecord a = Ok(0.1, 0.5, 9, {}), b = Ok(0.1, 0.5, 5, {});
  a.spec_steps = 4;
  a.draft_steps = 4;
  a.draft_tokens = 12;
  a.accepted_tokens = 5;
  a.accepted_per_position = {3, 2, 0};
  b.spec_steps = 2;
  b.draft_steps = 1;
  b.draft_tokens = 3;
  b.accepted_tokens = 1;
  b.accepted_per_position = {1};
  const nlohmann::json r = Summarize({a, b}, 1.0, ReportOptions());
  EXPECT_EQ(r["num_drafts"], 5);
  EXPECT_EQ(r["draft_tokens"], 15);
  EXPECT_EQ(r["accepted_tokens"], 6);
  EXPECT_DOUBLE_EQ(r["acceptance_rate"].get<double>(), 6.0 / 15);
  EXPECT_DOUBLE_EQ(r["mean_accepted_len"].get<double>(), (6.0 + 6) / 6);
  EXPECT_EQ(r["accepted_per_position"], nlohmann::json({4, 2, 0}));
  EXPECT_DOUBLE_EQ(r["acceptance_rate_per_position"][0].get<double>(), 4.0 / 5);
  EXPECT_DOUBLE_EQ(r["acceptance_rate_per_position"][1].get<double>(), 2.0 / 5);
}

TEST(LoadReportTest, FlagParsersFollowVllmSyntax) {
  EXPECT_EQ(ParseMetricPercentiles("25,50,99.9").value(), (std::vector<double>{25, 50, 99.9}));
  EXPECT_NE(ParseMetricPercentiles("99,101").status().message().find("--metric-percentiles"),
            std::string::npos);
  EXPECT_FALSE(ParseMetricPercentiles("x").ok());
  EXPECT_EQ(ParsePercentileMetrics("token_itl").value(), std::vector<std::string>{"token_itl"});
  EXPECT_EQ(ParsePercentileMetrics("ttft,e2el").value(),
            (std::vector<std::string>{"ttft", "e2el"}));
  EXPECT_NE(ParsePercentileMetrics("ttft,foo").status().message().find("'foo'"), std::string::npos);
  auto slo = ParseGoodput({"ttft:200", "tpot:50"});
  ASSERT_TRUE(slo.ok()) << slo.status();
  EXPECT_EQ(*slo, (std::map<std::string, double>{{"ttft", 200}, {"tpot", 50}}));
  EXPECT_TRUE(ParseGoodput({}).value().empty());
  EXPECT_NE(ParseGoodput({"ttft=200"}).status().message().find("KEY:VALUE"), std::string::npos);
  EXPECT_NE(ParseGoodput({"itl:5"}).status().message().find("'itl'"), std::string::npos);
  EXPECT_NE(ParseGoodput({"ttft:-1"}).status().message().find("negative"), std::string::npos);
}

}  // namespace
}  // namespace specula::loadgen
