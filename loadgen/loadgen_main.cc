// specula-loadgen: a load generator for the router's public gRPC API, reporting what
// `vllm bench serve` reports. Several servers (e.g. all-in-one and three-process) and several
// drafters are measured in one run on the same prompts, interleaved, so machine noise hits them
// alike; every setting is repeated and reported as median and min.
//
//   specula-loadgen --targets all=127.0.0.1:50051,split=127.0.0.1:50061 \
//       --drafters none,ngram --concurrency 1,4,16,64 --max-new-tokens 64 --repeats 3 --json
//       out.json
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/tokenizer/tokenizer.h"
#include "common/util/flags.h"
#include "common/util/status.h"
#include "loadgen/load_report.h"
#include "loadgen/load_runner.h"
#include "tools/cli/bench_prompts.h"

namespace specula::loadgen {
namespace {

struct Flags {
  std::string targets = "server=127.0.0.1:50051";
  std::string model = "models/pyllama-6m";
  std::string prompts;
  std::string prompt_dir = cli::kHeldOutPromptDir;
  int64_t num_prompts = 0;
  int64_t prompt_tokens = 64;
  int64_t max_new_tokens = 64;
  std::vector<int64_t> concurrency = {1, 4, 16, 64};
  std::string drafters = "none";
  int64_t draft_len = 0;
  double request_rate = 0;
  int64_t repeats = 1;
  double temperature = 0;
  double slo_ttft_ms = 0;
  double slo_tpot_ms = 0;
  double slo_e2el_ms = 0;
  std::string json;
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

struct Target {
  std::string label;
  std::string address;
  std::unique_ptr<v1::Generation::Stub> stub;
};

StatusOr<std::vector<Target>> ParseTargets(const std::string& spec) {
  std::vector<Target> targets;
  for (const std::string& item : Split(spec)) {
    const size_t eq = item.find('=');
    Target t;
    t.label = eq == std::string::npos ? item : item.substr(0, eq);
    t.address = eq == std::string::npos ? item : item.substr(eq + 1);
    if (t.label.empty() || t.address.empty()) {
      return InvalidArgumentError(StrCat("--targets: '", item, "' is not LABEL=HOST:PORT"));
    }
    t.stub =
        v1::Generation::NewStub(grpc::CreateChannel(t.address, grpc::InsecureChannelCredentials()));
    targets.push_back(std::move(t));
  }
  if (targets.empty()) return InvalidArgumentError("--targets is empty");
  return targets;
}

double Median(std::vector<double> v) { return Percentile(std::move(v), 50); }

Status Run(const Flags& f) {
  ASSIGN_OR_RETURN(std::vector<Target> targets, ParseTargets(f.targets));
  const std::vector<std::string> drafters = Split(f.drafters);
  if (drafters.empty()) return InvalidArgumentError("--drafters is empty");
  if (f.repeats < 1) return InvalidArgumentError("--repeats must be at least 1");
  for (int64_t c : f.concurrency) {
    if (c < 1) return InvalidArgumentError(StrCat("--concurrency values must be >= 1, got ", c));
  }
  ASSIGN_OR_RETURN(
      std::unique_ptr<Tokenizer> tokenizer,
      Tokenizer::FromFile((std::filesystem::path(f.model) / "tokenizer.json").string()));
  const int64_t most = *std::max_element(f.concurrency.begin(), f.concurrency.end());
  auto count_for = [&](int64_t c) {
    return f.num_prompts > 0 ? f.num_prompts : std::max<int64_t>(8, 2 * c);
  };
  std::vector<std::vector<int32_t>> all_prompts;
  if (!f.prompts.empty()) {
    ASSIGN_OR_RETURN(all_prompts, cli::PromptFile(*tokenizer, f.prompts));
  } else {
    ASSIGN_OR_RETURN(all_prompts, cli::HeldOutPrompts(*tokenizer, f.prompt_dir, count_for(most),
                                                      f.prompt_tokens));
  }
  if (all_prompts.empty()) return InvalidArgumentError("no prompts");

  nlohmann::json results = nlohmann::json::array();
  std::printf("%-8s %-12s %5s %10s %10s %9s %9s %9s %9s %9s %6s %6s\n", "target", "drafter", "conc",
              "tok/s med", "tok/s min", "vs none", "vs first", "TTFT ms", "TPOT ms", "ITL p99", "a",
              "fail");
  for (int64_t c : f.concurrency) {
    std::vector<std::vector<int32_t>> prompts;
    for (int64_t i = 0; i < count_for(c); ++i) {
      prompts.push_back(all_prompts[static_cast<size_t>(i) % all_prompts.size()]);
    }
    // Settings in rotated order each repeat, all on the same prompts.
    struct Setting {
      size_t target;
      std::string drafter;
      std::vector<nlohmann::json> runs;
    };
    std::vector<Setting> settings;
    for (size_t t = 0; t < targets.size(); ++t) {
      for (const std::string& d : drafters) settings.push_back({t, d, {}});
    }
    for (int64_t rep = 0; rep < f.repeats; ++rep) {
      for (size_t k = 0; k < settings.size(); ++k) {
        Setting& s = settings[(k + static_cast<size_t>(rep)) % settings.size()];
        LoadOptions o;
        o.concurrency = static_cast<int32_t>(c);
        o.request_rate = f.request_rate;
        o.seed = static_cast<uint64_t>(rep);
        o.max_new_tokens = static_cast<int32_t>(f.max_new_tokens);
        o.drafter = s.drafter == "default" ? "" : s.drafter;
        o.max_draft_tokens = static_cast<int32_t>(f.draft_len);
        o.temperature = static_cast<float>(f.temperature);
        double duration = 0;
        auto records = RunLoad(*targets[s.target].stub, prompts, o, &duration);
        nlohmann::json run = Summarize(
            records, duration,
            {.ttft_ms = f.slo_ttft_ms, .tpot_ms = f.slo_tpot_ms, .e2el_ms = f.slo_e2el_ms});
        std::fprintf(stderr, "  %s %s c=%lld repeat %lld: %.1f tok/s, %lld failed\n",
                     targets[s.target].label.c_str(), s.drafter.c_str(), static_cast<long long>(c),
                     static_cast<long long>(rep + 1), run["output_throughput"].get<double>(),
                     run["failed"].get<long long>());
        s.runs.push_back(run);
      }
    }
    std::map<std::pair<size_t, std::string>, double> median_of;
    for (Setting& s : settings) {
      std::vector<double> tps;
      for (const auto& r : s.runs) tps.push_back(r["output_throughput"].get<double>());
      median_of[{s.target, s.drafter}] = Median(tps);
    }
    for (Setting& s : settings) {
      std::vector<double> tps;
      for (const auto& r : s.runs) tps.push_back(r["output_throughput"].get<double>());
      const double med = Median(tps);
      // The repeat closest to the median stands for the latencies.
      size_t pick = 0;
      for (size_t i = 0; i < tps.size(); ++i) {
        if (std::abs(tps[i] - med) < std::abs(tps[pick] - med)) pick = i;
      }
      const nlohmann::json& rep = s.runs[pick];
      auto none = median_of.find({s.target, "none"});
      const double vs_none = none != median_of.end() && none->second > 0 ? med / none->second : 0;
      const double first = median_of[{0, s.drafter}];
      const double vs_first = first > 0 ? med / first : 0;
      int64_t failed = 0;
      for (const auto& r : s.runs) failed += r["failed"].get<int64_t>();
      std::printf("%-8s %-12s %5lld %10.1f %10.1f %8.2fx %8.3fx %9.1f %9.2f %9.2f %6.2f %6lld\n",
                  targets[s.target].label.c_str(), s.drafter.c_str(), static_cast<long long>(c),
                  med, *std::min_element(tps.begin(), tps.end()), vs_none, vs_first,
                  rep["mean_ttft_ms"].get<double>(), rep["mean_tpot_ms"].get<double>(),
                  rep["p99_itl_ms"].get<double>(), rep["mean_accepted_len"].get<double>(),
                  static_cast<long long>(failed));
      nlohmann::json row = rep;
      row["target"] = targets[s.target].label;
      row["address"] = targets[s.target].address;
      row["drafter"] = s.drafter;
      row["concurrency"] = c;
      row["num_prompts"] = prompts.size();
      row["output_throughput_median"] = med;
      row["output_throughput_min"] = *std::min_element(tps.begin(), tps.end());
      row["output_throughput_repeats"] = tps;
      row["speedup_vs_none"] = vs_none;
      row["ratio_vs_first_target"] = vs_first;
      results.push_back(row);
    }
    std::fflush(stdout);
  }
  if (!f.json.empty()) {
    nlohmann::json out = {{"max_new_tokens", f.max_new_tokens},
                          {"prompt_tokens", f.prompts.empty() ? f.prompt_tokens : -1},
                          {"prompts", f.prompts.empty() ? f.prompt_dir : f.prompts},
                          {"request_rate", f.request_rate},
                          {"repeats", f.repeats},
                          {"temperature", f.temperature},
                          {"results", results}};
    std::ofstream file(f.json);
    file << out.dump(2) << "\n";
    if (!file) return InternalError(StrCat("cannot write --json ", f.json));
  }
  // Failed requests make the run fail, so scripts notice.
  for (const auto& row : results) {
    if (row["failed"].get<int64_t>() > 0) {
      return UnavailableError(StrCat(row["failed"].get<int64_t>(), " requests failed on ",
                                     row["target"].get<std::string>(), ": ",
                                     row.value("errors", nlohmann::json::array()).dump()));
    }
  }
  return OkStatus();
}

}  // namespace
}  // namespace specula::loadgen

int main(int argc, char** argv) {
  using specula::loadgen::Flags;
  Flags f;
  specula::FlagSet flags("specula-loadgen");
  flags.AddString("targets", &f.targets, "comma-separated LABEL=HOST:PORT routers to measure");
  flags.AddString("model", &f.model, "model directory whose tokenizer.json cuts the prompts");
  flags.AddString("prompts", &f.prompts, "JSONL prompts ({\"prompt\"} or {\"prompt_ids\"} lines)");
  flags.AddString("prompt-dir", &f.prompt_dir, "held-out .py files to cut prompts from");
  flags.AddInt("num-prompts", &f.num_prompts, "requests per run (0 = 2 x concurrency, at least 8)");
  flags.AddInt("prompt-tokens", &f.prompt_tokens, "tokens per held-out prompt");
  flags.AddInt("max-new-tokens", &f.max_new_tokens, "tokens generated per request (ignore_eos)");
  flags.AddIntList("concurrency", &f.concurrency, "concurrent clients, one run each");
  flags.AddString("drafters", &f.drafters,
                  "comma-separated speculation settings per request: none, default, or a drafter");
  flags.AddInt("draft-len", &f.draft_len, "max_draft_tokens per request (0 = server default)");
  flags.AddDouble("request-rate", &f.request_rate, "Poisson arrivals per second (0 = all at once)");
  flags.AddInt("repeats", &f.repeats, "runs per setting (median and min reported)");
  flags.AddDouble("temperature", &f.temperature, "sampling temperature (0 = greedy)");
  flags.AddDouble("goodput-ttft-ms", &f.slo_ttft_ms, "goodput SLO on TTFT (0 = none)");
  flags.AddDouble("goodput-tpot-ms", &f.slo_tpot_ms, "goodput SLO on TPOT (0 = none)");
  flags.AddDouble("goodput-e2el-ms", &f.slo_e2el_ms, "goodput SLO on E2E latency (0 = none)");
  flags.AddString("json", &f.json, "write every run's summary here");
  std::vector<std::string> args(argv + 1, argv + argc);
  specula::Status parsed = flags.Parse(args);
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  if (!parsed.ok()) {
    std::fprintf(stderr, "specula-loadgen: %s\n", parsed.ToString().c_str());
    return 1;
  }
  specula::Status status = specula::loadgen::Run(f);
  if (!status.ok()) {
    std::fprintf(stderr, "specula-loadgen: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
