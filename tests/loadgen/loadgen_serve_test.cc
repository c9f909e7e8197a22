// Black-box test of specula-loadgen: the real binary against a real `specula serve` (bundled
// model, ephemeral port). It waits for readiness, warms up, runs two drafters and writes the flat
// vLLM result objects, the --json summary and the comparison table; JSONL output lengths are
// honoured; the banner and the readiness timeout are clear. No timing assertions.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/services/http_get.h"
#include "tests/services/server_process.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

const std::string kBundled = std::string(SPECULA_SOURCE_DIR) + "/models/pyllama-6m";
const std::string kLoadgen = std::string(SPECULA_BINARY_DIR) + "/bin/specula-loadgen";

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

Result RunLoadgen(const std::vector<std::string>& args) {
  std::string command = kLoadgen;
  for (const std::string& a : args) command += " '" + a + "'";
  command += " 2>&1";
  Result r;
  std::FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

nlohmann::json ReadJson(const fs::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

class LoadgenServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess;
    ASSERT_TRUE(server_->Start(
        {"--model", kBundled, "--drafter", "ngram", "--port", "0", "--metrics-port", "-1"}))
        << server_->error();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("loadgen_serve_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Target() const { return "s=127.0.0.1:" + std::to_string(server_->port()); }

  fs::path dir_;
  static ServerProcess* server_;
};

ServerProcess* LoadgenServeTest::server_ = nullptr;

TEST_F(LoadgenServeTest, WritesVllmResultsSummaryAndTable) {
  const fs::path results = dir_ / "results";
  const Result r = RunLoadgen({"--targets",
                               Target(),
                               "--model",
                               kBundled,
                               "--drafters",
                               "none,ngram",
                               "--concurrency",
                               "2",
                               "--num-prompts",
                               "4",
                               "--prompt-tokens",
                               "16",
                               "--max-new-tokens",
                               "6",
                               "--ignore-eos",
                               "--request-rate",
                               "50",
                               "--burstiness",
                               "0.5",
                               "--num-warmups",
                               "1",
                               "--disable-tqdm",
                               "--goodput",
                               "ttft:60000",
                               "tpot:60000",
                               "--metadata",
                               "run=ci",
                               "build=test",
                               "--metric-percentiles",
                               "50,99",
                               "--result-dir",
                               results.string(),
                               "--json",
                               (dir_ / "summary.json").string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("vs none"), std::string::npos) << r.output;

  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(results)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 2u) << r.output;  // one flat object per (drafter, concurrency, repeat)
  for (const fs::path& file : files) {
    EXPECT_NE(file.filename().string().find("qps-concurrency2-pyllama-6m-"), std::string::npos)
        << file;
    const nlohmann::json j = ReadJson(file);
    for (const char* key : {"date",
                            "backend",
                            "model_id",
                            "tokenizer_id",
                            "num_prompts",
                            "request_rate",
                            "burstiness",
                            "max_concurrency",
                            "duration",
                            "completed",
                            "total_input_tokens",
                            "total_output_tokens",
                            "request_throughput",
                            "request_goodput",
                            "output_throughput",
                            "total_token_throughput",
                            "mean_ttft_ms",
                            "median_ttft_ms",
                            "std_ttft_ms",
                            "p50_ttft_ms",
                            "p99_ttft_ms",
                            "mean_tpot_ms",
                            "p99_tpot_ms",
                            "mean_itl_ms",
                            "p99_itl_ms",
                            "mean_token_itl_ms",
                            "mean_e2el_ms",
                            "input_lens",
                            "output_lens",
                            "ttfts",
                            "itls",
                            "itl_tokens",
                            "generated_texts",
                            "errors",
                            "mean_accepted_len",
                            "acceptance_rate",
                            "acceptance_rate_per_position",
                            "drafter"}) {
      EXPECT_TRUE(j.contains(key)) << key << " in " << file;
    }
    EXPECT_EQ(j["model_id"], "pyllama-6m");
    EXPECT_EQ(j["max_concurrency"], 2);
    EXPECT_EQ(j["num_prompts"], 4);
    EXPECT_EQ(j["completed"], 4);
    EXPECT_EQ(j["run"], "ci");
    EXPECT_EQ(j["build"], "test");
    EXPECT_DOUBLE_EQ(j["burstiness"].get<double>(), 0.5);
    EXPECT_FALSE(j["request_goodput"].is_null());
    EXPECT_EQ(j["output_lens"], nlohmann::json({6, 6, 6, 6}));  // --ignore-eos
    EXPECT_EQ(j["input_lens"].size(), 4u);
    EXPECT_EQ(j["errors"], nlohmann::json({"", "", "", ""}));
    // Each gap's message brought at least one token; after the first message's, all the rest.
    for (size_t i = 0; i < j["itls"].size(); ++i) {
      ASSERT_EQ(j["itl_tokens"][i].size(), j["itls"][i].size()) << file;
      int64_t after_first = 0;
      for (const auto& n : j["itl_tokens"][i]) {
        EXPECT_GE(n.get<int64_t>(), 1);
        after_first += n.get<int64_t>();
      }
      EXPECT_LT(after_first, 6) << file;
      EXPECT_GE(j["mean_token_itl_ms"].get<double>(), 0.0);
    }
  }
  const nlohmann::json summary = ReadJson(dir_ / "summary.json");
  ASSERT_EQ(summary["results"].size(), 2u);
  EXPECT_EQ(summary["run"], "ci");
  for (const auto& row : summary["results"]) {
    EXPECT_TRUE(row.contains("speedup_vs_none"));
    EXPECT_TRUE(row.contains("output_throughput_median"));
    // Each repeat's latencies, to pair repeats; one repeat here, so its median is itself.
    for (const char* key : {"mean_tpot_ms", "p99_tpot_ms", "p99_itl_ms"}) {
      ASSERT_TRUE(row.contains(std::string(key) + "_repeats")) << key;
      ASSERT_EQ(row[std::string(key) + "_repeats"].size(), 1u) << key;
      EXPECT_DOUBLE_EQ(row[std::string(key) + "_median"].get<double>(), row[key].get<double>());
    }
    EXPECT_FALSE(row.contains("p50_itl_ms_repeats"));  // only the listed metrics
    EXPECT_FALSE(row.contains("itls"));                // per-request lists only in the result files
    // Paired with the same repeat's run without speculation: one repeat, so the paired ratios
    // are the run's own over none's (none's over itself: 1).
    ASSERT_EQ(row["speedup_vs_none_repeats"].size(), 1u) << row.dump();
    EXPECT_DOUBLE_EQ(row["speedup_vs_none_paired_median"].get<double>(),
                     row["speedup_vs_none"].get<double>());
    EXPECT_DOUBLE_EQ(row["speedup_vs_none_paired_min"].get<double>(),
                     row["speedup_vs_none"].get<double>());
    ASSERT_EQ(row["tpot_vs_none_repeats"].size(), 1u) << row.dump();
    ASSERT_EQ(row["itl_vs_none_repeats"].size(), 1u) << row.dump();
    if (row["drafter"] == "none") {
      EXPECT_DOUBLE_EQ(row["tpot_vs_none_paired_median"].get<double>(), 1.0);
      EXPECT_DOUBLE_EQ(row["itl_vs_none_paired_median"].get<double>(), 1.0);
    }
  }
}

TEST_F(LoadgenServeTest, JsonlOutputLengthsAreHonouredAndNoNoneMeansNoVsNone) {
  const fs::path prompts = dir_ / "prompts.jsonl";
  std::ofstream(prompts) << "{\"prompt\": \"import os\\n\", \"output_len\": 3}\n"
                            "{\"prompt\": \"def main():\\n\", \"output_len\": 5}\n";
  // No --model: the tokenizer is found through the server's model path.
  const Result r = RunLoadgen({"--targets", Target(), "--drafters", "ngram", "--concurrency", "1",
                               "--num-prompts", "2", "--dataset-name", "jsonl", "--dataset-path",
                               prompts.string(), "--ignore-eos", "--disable-tqdm", "--result-dir",
                               dir_.string(), "--result-filename", "run.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("vs none"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Serving Benchmark Result"), std::string::npos) << r.output;
  const nlohmann::json j = ReadJson(dir_ / "run.json");
  EXPECT_EQ(j["output_lens"], nlohmann::json({3, 5}));
  EXPECT_TRUE(j["request_goodput"].is_null());
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["tokenizer_id"], kBundled);
}

// JSONL per-request settings reach the server through the public API: a 1 ms deadline ends in
// DEADLINE_EXCEEDED, a client cancel in CANCELLED (or, if this process was paused past the whole
// generation, in a completed request), a stop string ends the text before it, a seeded sampled
// request repeats itself, and a line's drafter wins over --drafters. The asked-for failures do not
// fail the run; an unknown drafter does.
TEST_F(LoadgenServeTest, JsonlRequestSettingsReachTheServer) {
  const fs::path prompts = dir_ / "mix.jsonl";
  std::ofstream(prompts)
      << "{\"prompt\": \"def main():\\n\", \"output_len\": 400, \"ignore_eos\": true, "
         "\"timeout_ms\": 1}\n"
         "{\"prompt\": \"def main():\\n\", \"output_len\": 400, \"ignore_eos\": true, "
         "\"cancel_after_ms\": 30}\n"
         "{\"prompt\": \"import os\\n\", \"output_len\": 40, \"stop\": [\"\\n\"]}\n"
         "{\"prompt\": \"import os\\n\", \"output_len\": 12, \"temperature\": 1.0, \"top_p\": 0.9, "
         "\"seed\": 7, \"drafter\": \"none\"}\n"
         "{\"prompt\": \"import os\\n\", \"output_len\": 12, \"temperature\": 1.0, \"top_p\": 0.9, "
         "\"seed\": 7, \"drafter\": \"ngram\"}\n";
  const Result r = RunLoadgen({"--targets",         Target(),
                               "--model",           kBundled,
                               "--drafters",        "none",
                               "--concurrency",     "1",
                               "--num-prompts",     "5",
                               "--dataset-name",    "jsonl",
                               "--dataset-path",    prompts.string(),
                               "--ignore-eos",      "--disable-tqdm",
                               "--result-dir",      dir_.string(),
                               "--result-filename", "mix.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = ReadJson(dir_ / "mix.json");
  ASSERT_EQ(j["errors"].size(), 5u);
  EXPECT_EQ(j["errors"][0].get<std::string>().rfind("4: ", 0), 0u) << j["errors"];
  const std::string cancelled = j["errors"][1];
  EXPECT_TRUE(cancelled.rfind("1: ", 0) == 0 || (cancelled.empty() && j["output_lens"][1] == 400))
      << cancelled;
  EXPECT_EQ(j["errors"][2], "");
  EXPECT_EQ(j["generated_texts"][2].get<std::string>().find('\n'), std::string::npos);
  EXPECT_TRUE(j["finish_reasons"][2] == "stop_string" || j["finish_reasons"][2] == "length")
      << j["finish_reasons"];
  EXPECT_EQ(j["errors"][3], "");
  EXPECT_EQ(j["finish_reasons"][3], "length");
  EXPECT_EQ(j["output_lens"][3], 12);
  // Speculation is lossless in distribution, not token for token across drafters.
  EXPECT_EQ(j["errors"][4], "");

  // Seeded sampling repeats itself without speculation. (With a drafter under the adaptive draft
  // budget it does not: the budget's measured step costs change the draft, and with it which
  // random draws each token gets; docs/BENCHMARKS.md, the soak section.)
  std::ofstream(prompts) << "{\"prompt\": \"import os\\n\", \"output_len\": 4, \"seed\": 7}\n"
                            "{\"prompt\": \"import os\\n\", \"output_len\": 4, \"temperature\": "
                            "0.7, \"seed\": 7, \"drafter\": \"none\"}\n"
                            "{\"prompt\": \"import os\\n\", \"output_len\": 4, \"temperature\": "
                            "0.7, \"seed\": 7, \"drafter\": \"none\"}\n"
                            "{\"prompt\": \"import\", \"drafter\": \"nope\"}\n";
  const Result bad = RunLoadgen({"--targets", Target(), "--model", kBundled, "--drafters", "ngram",
                                 "--concurrency", "1", "--num-prompts", "4", "--dataset-name",
                                 "jsonl", "--dataset-path", prompts.string(), "--disable-tqdm",
                                 "--result-dir", dir_.string(), "--result-filename", "bad.json"});
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  const nlohmann::json b = ReadJson(dir_ / "bad.json");
  EXPECT_EQ(b["generated_texts"][1], b["generated_texts"][2]);
  EXPECT_EQ(b["errors"][3].get<std::string>().rfind("3: ", 0), 0u) << b["errors"];
  EXPECT_NE(b["errors"][3].get<std::string>().find("nope"), std::string::npos) << b["errors"];
}

// Every speculation setting gets its warm-up (a drafter's first requests are when the server
// learns its costs and acceptance): 2 settings x (3 warm-ups + 2 measured requests) reach the
// server. The dataset's own per-request settings are not the warm-up's: the JSONL's 1 ms
// timeout fails only its measured request.
TEST_F(LoadgenServeTest, WarmsUpEachSpeculationSetting) {
  const fs::path prompts = dir_ / "warm.jsonl";
  std::ofstream(prompts)
      << "{\"prompt\": \"import os\\n\", \"output_len\": 300, \"timeout_ms\": 1}\n"
         "{\"prompt\": \"def main():\\n\", \"output_len\": 4}\n";
  auto finished = [&] {
    const HttpResponse m = HttpGet(server_->metrics_port(), "/metrics");
    return std::max(
        SeriesValue(m.body, "specula_request_success_total", "finished_reason=\"length\""), 0.0);
  };
  const double before = finished();
  const Result r = RunLoadgen({"--targets", Target(), "--model", kBundled, "--drafters",
                               "none,ngram", "--concurrency", "1", "--num-prompts", "2",
                               "--dataset-name", "jsonl", "--dataset-path", prompts.string(),
                               "--ignore-eos", "--num-warmups", "3", "--disable-tqdm"});
  ASSERT_EQ(r.exit_code, 0) << r.output;  // a failed request is counted, not fatal
  EXPECT_EQ(r.output.find("warm-up"), std::string::npos) << r.output;
  EXPECT_EQ(finished() - before, 2 * 3 + 2 * 1) << r.output;
}

TEST_F(LoadgenServeTest, PlotDrawsChartsNextToTheSummary) {
  if (std::system("/usr/bin/python3 -c 'import matplotlib' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-matplotlib is not installed (scripts/setup.sh installs it)";
  }
  const Result r = RunLoadgen(
      {"--targets", Target(), "--model", kBundled, "--drafters", "none,ngram", "--concurrency", "1",
       "--num-prompts", "2", "--prompt-tokens", "8", "--max-new-tokens", "4", "--ignore-eos",
       "--disable-tqdm", "--json", (dir_ / "bench.json").string(), "--plot"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* chart : {"throughput", "latency", "acceptance", "speedup"}) {
    EXPECT_TRUE(fs::exists(dir_ / (std::string("bench-") + chart + ".png"))) << chart << r.output;
  }
}

size_t CountRequests(const std::string& server_stderr) {
  size_t n = 0;
  for (size_t at = server_stderr.find(" request id="); at != std::string::npos;
       at = server_stderr.find(" request id=", at + 1)) {
    ++n;
  }
  return n;
}

// Two replicas behind one target, as a client of a headless Service sees them: the calls are
// balanced over both (round_robin), not pinned to one connection.
TEST_F(LoadgenServeTest, SeveralAddressesAreBalancedRoundRobin) {
  ServerProcess second;
  ASSERT_TRUE(second.Start(
      {"--model", kBundled, "--drafter", "ngram", "--port", "0", "--metrics-port", "-1"}))
      << second.error();
  const size_t first_before = CountRequests(server_->Stderr());
  const std::string replicas = "rr=127.0.0.1:" + std::to_string(server_->port()) +
                               "+127.0.0.1:" + std::to_string(second.port());
  const Result r =
      RunLoadgen({"--targets",        replicas,      "--model",           kBundled,
                  "--drafters",       "ngram",       "--concurrency",     "2",
                  "--num-prompts",    "12",          "--prompt-tokens",   "8",
                  "--max-new-tokens", "2",           "--ignore-eos",      "--disable-tqdm",
                  "--result-dir",     dir_.string(), "--result-filename", "rr.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(ReadJson(dir_ / "rr.json")["completed"], 12);
  const size_t first = CountRequests(server_->Stderr()) - first_before;
  const size_t other = CountRequests(second.Stderr());
  EXPECT_EQ(first + other, 12u) << r.output;
  EXPECT_GT(first, 0u);
  EXPECT_GT(other, 0u);

  for (const char* bad : {"rr=127.0.0.1:1++127.0.0.1:2", "rr=localhost:1+localhost:2",
                          "rr=127.0.0.1:1+[::1]:2", "rr=127.0.0.1:1+"}) {
    const Result e = RunLoadgen({"--targets", bad, "--model", kBundled, "--disable-tqdm"});
    EXPECT_EQ(e.exit_code, 1) << bad;
    EXPECT_NE(e.output.find("is not IP:PORT+IP:PORT+..."), std::string::npos) << e.output;
  }
}

// No --model and a server whose model path is not readable here (another machine's, say): the
// tokenizer comes from the bundled model of the checkout the binary was built in, whatever the
// working directory (the default was once relative to it).
TEST_F(LoadgenServeTest, NoModelFallsBackToTheCheckoutsBundledModel) {
  const fs::path link = dir_ / "model-elsewhere";
  fs::create_directory_symlink(kBundled, link);
  ServerProcess server;
  ASSERT_TRUE(server.Start(
      {"--model", link.string(), "--drafter", "ngram", "--port", "0", "--metrics-port", "-1"}))
      << server.error();
  fs::remove(link);  // the path the server reports no longer exists
  const Result r = RunLoadgen({"--targets", "s=127.0.0.1:" + std::to_string(server.port()),
                               "--drafters", "none", "--concurrency", "1", "--num-prompts", "1",
                               "--prompt-tokens", "8", "--max-new-tokens", "2", "--disable-tqdm",
                               "--result-dir", dir_.string(), "--result-filename", "run.json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = ReadJson(dir_ / "run.json");
  EXPECT_EQ(j["ignore_eos"], false);  // only with --ignore-eos (or the random dataset)
  const std::string tokenizer_id = j["tokenizer_id"];
  EXPECT_NE(tokenizer_id, link.string());
  EXPECT_TRUE(fs::equivalent(tokenizer_id, kBundled)) << tokenizer_id;
}

TEST_F(LoadgenServeTest, UsageBannerNamesTheProgram) {
  const Result r = RunLoadgen({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output.rfind("usage: specula-loadgen [flags]\n", 0), 0u) << r.output;
  EXPECT_NE(r.output.find("--goodput"), std::string::npos);
}

TEST_F(LoadgenServeTest, ReadinessTimeoutIsAClearError) {
  // A port nothing listens on (the server's, after asking the kernel for a free one, is not
  // guaranteed free; port 1 needs root to bind and is closed here).
  const Result r = RunLoadgen({"--targets", "x=127.0.0.1:1", "--model", kBundled,
                               "--ready-check-timeout-sec", "0.5", "--disable-tqdm"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("not SERVING after 0.5 s"), std::string::npos) << r.output;
}

TEST_F(LoadgenServeTest, BadFlagsNameTheFlag) {
  for (const auto& [args, expected] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--goodput", "ttft=5"}, "--goodput"},
           {{"--percentile-metrics", "ttft,nope"}, "--percentile-metrics"},
           {{"--burstiness", "0"}, "--burstiness"},
           {{"--metadata", "novalue"}, "--metadata"},
           {{"--dataset-name", "csv"}, "--dataset-name"},
           {{"--model", "/nonexistent"}, "--model /nonexistent: no tokenizer.json"},
       }) {
    std::vector<std::string> full = {"--targets",
                                     Target(),
                                     "--model",
                                     kBundled,
                                     "--disable-tqdm",
                                     "--concurrency",
                                     "1",
                                     "--num-prompts",
                                     "1",
                                     "--max-new-tokens",
                                     "1"};
    full.insert(full.end(), args.begin(), args.end());
    const Result r = RunLoadgen(full);
    EXPECT_EQ(r.exit_code, 1) << args[0];
    EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace specula
