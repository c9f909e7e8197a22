// specula-loadgen: a load generator for the router's public gRPC API, reporting what `vllm bench
// serve` reports. Several servers (e.g. all-in-one and three-process) and several drafters are
// measured in one run on the same prompts, interleaved, so machine noise hits them alike; every
// setting is repeated and reported as median and min.
//
//   specula-loadgen --targets all=127.0.0.1:50051,split=127.0.0.1:50061
//       --drafters none,ngram --concurrency 1,4,16,64 --max-new-tokens 64 --ignore-eos
//       --repeats 3 --json out.json --result-dir results/ --plot
//
// Main loop, step by step:
//   1. wait until every target's health service says SERVING (--ready-check-timeout-sec);
//   2. ask the first target for its model (model_id; the tokenizer when --model is not given);
//   3. load the dataset (heldout, jsonl, sharegpt or random) and send --num-warmups requests per
//      target and speculation setting;
//   4. for each concurrency, repeat: for each (target, drafter) in rotated order, send the same
//      requests at the arrival times of the seed (Poisson / gamma / ramp-up) and summarize the
//      run as one flat vLLM result object (--result-dir);
//   5. print the comparison table, write the --json summary, draw the --plot charts.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
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
#include "loadgen/arrivals.h"
#include "loadgen/dataset.h"
#include "loadgen/load_report.h"
#include "loadgen/load_runner.h"
#include "loadgen/progress_bar.h"
#include "loadgen/readiness.h"
#include "tools/cli/bench_prompts.h"

namespace specula::loadgen {
namespace {

namespace fs = std::filesystem;

// The bundled model, looked up beside the binary (<checkout>/build/bin/specula-loadgen) when
// neither --model nor the server's own model path names a readable tokenizer.
constexpr char kBundledModel[] = "models/pyllama-6m";

struct Flags {
  std::string targets = "server=127.0.0.1:50051";
  std::string tls_ca;  // TLS: the servers' CA (empty = plaintext)
  std::string tls_cert;
  std::string tls_key;
  std::string api_token_file;  // bearer token (empty = $SPECULA_API_TOKEN, or none)
  std::string model;
  std::string dataset_name;
  std::string dataset_path;
  std::string prompts;
  std::string prompt_dir = cli::kHeldOutPromptDir;
  int64_t num_prompts = 0;
  int64_t prompt_tokens = 64;
  int64_t max_new_tokens = 64;
  int64_t random_input_len = 0;
  int64_t random_output_len = 0;
  double random_range_ratio = 0;
  std::vector<int64_t> concurrency = {1, 4, 16, 64};
  std::string drafters = "none";
  int64_t draft_len = 0;
  double request_rate = 0;
  double burstiness = 1.0;
  std::string ramp_up_strategy;
  double ramp_up_start_rps = 0;
  double ramp_up_end_rps = 0;
  int64_t seed = 0;
  int64_t repeats = 1;
  double temperature = 0;
  bool ignore_eos = false;
  int64_t num_warmups = 0;
  double ready_check_timeout_s = 600;
  bool disable_tqdm = false;
  bool progress = false;
  std::string metric_percentiles = "99";
  std::string percentile_metrics = "ttft,tpot,itl";
  std::vector<std::string> goodput;   // --goodput KEY:VALUE ...
  std::vector<std::string> metadata;  // --metadata KEY=VALUE ...
  double slo_ttft_ms = 0;
  double slo_tpot_ms = 0;
  double slo_e2el_ms = 0;
  std::string json;
  std::string result_dir;
  std::string result_filename;
  bool plot = false;
  std::string plot_script;
  double timeout_s = 600;
};

std::vector<std::string> Split(const std::string& s, char separator = ',') {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, separator)) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Removes every `--name V1 V2 ...` / `--name=V` from args (values up to the next flag), as
// argparse's nargs: the FlagSet takes one value per flag.
std::vector<std::string> TakeMultiValue(std::vector<std::string>& args, const std::string& name) {
  std::vector<std::string> values, rest;
  const std::string flag = "--" + name;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].rfind(flag + "=", 0) == 0) {
      values.push_back(args[i].substr(flag.size() + 1));
    } else if (args[i] == flag) {
      while (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) values.push_back(args[++i]);
    } else {
      rest.push_back(args[i]);
    }
  }
  args = std::move(rest);
  return values;
}

struct Target {
  std::string label;
  std::string address;                // as given in --targets
  std::vector<std::string> backends;  // what the readiness wait checks, one by one
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Generation::Stub> stub;
};

StatusOr<std::string> ReadFlagFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgumentError(StrCat("--", flag, ": cannot read '", path, "'"));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// Plaintext, or TLS trusting --tls-ca (presenting --tls-cert/--tls-key when given).
StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(const Flags& f) {
  if (f.tls_ca.empty()) {
    if (!f.tls_cert.empty() || !f.tls_key.empty()) {
      return InvalidArgumentError("--tls-cert/--tls-key need --tls-ca");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (f.tls_cert.empty() != f.tls_key.empty()) {
    return InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  grpc::SslCredentialsOptions options;
  ASSIGN_OR_RETURN(options.pem_root_certs, ReadFlagFile("tls-ca", f.tls_ca));
  if (!f.tls_cert.empty()) {
    ASSIGN_OR_RETURN(options.pem_cert_chain, ReadFlagFile("tls-cert", f.tls_cert));
    ASSIGN_OR_RETURN(options.pem_private_key, ReadFlagFile("tls-key", f.tls_key));
  }
  return grpc::SslCredentials(options);
}

// "Bearer <token>" from --api-token-file or $SPECULA_API_TOKEN; "" when neither is set.
StatusOr<std::string> Authorization(const Flags& f) {
  std::string token;
  if (!f.api_token_file.empty()) {
    ASSIGN_OR_RETURN(token, ReadFlagFile("api-token-file", f.api_token_file));
  } else if (const char* env = std::getenv("SPECULA_API_TOKEN"); env != nullptr) {
    token = env;
  }
  const size_t begin = token.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return std::string();
  token = token.substr(begin, token.find_last_not_of(" \t\r\n") - begin + 1);
  return "Bearer " + token;
}

// The gRPC target URI of one --targets address: HOST:PORT or a URI (dns:///name:port) as is;
// IP:PORT+IP:PORT+... (the replicas of one deployment) as gRPC's ipv4:/ipv6: address list.
StatusOr<std::string> ChannelTarget(const std::string& address,
                                    std::vector<std::string>* backends) {
  if (address.find('+') == std::string::npos) {
    backends->push_back(address);
    return address;
  }
  const Status bad = InvalidArgumentError(
      StrCat("--targets: '", address,
             "' is not IP:PORT+IP:PORT+... (IP literals of one family; a dns:/// name for host "
             "names)"));
  if (address.front() == '+' || address.back() == '+' || address.find("++") != std::string::npos) {
    return bad;
  }
  std::string scheme;
  std::string list;
  for (const std::string& backend : Split(address, '+')) {
    // gRPC's ipv4:/ipv6: lists take literals only: 10.0.0.1:50051 or [fd00::1]:50051.
    const size_t colon = backend.rfind(':');
    const bool v6 = backend.rfind('[', 0) == 0;
    const std::string host = colon == std::string::npos ? "" : backend.substr(0, colon);
    const std::string port = colon == std::string::npos ? "" : backend.substr(colon + 1);
    const bool literal =
        v6 ? host.size() > 2 && host.back() == ']' &&
                 host.find_first_not_of("0123456789abcdefABCDEF:.", 1) == host.size() - 1
           : !host.empty() && host.find_first_not_of("0123456789.") == std::string::npos;
    const std::string kind = v6 ? "ipv6:" : "ipv4:";
    if (!literal || port.empty() || port.find_first_not_of("0123456789") != std::string::npos ||
        (!scheme.empty() && kind != scheme)) {
      return bad;
    }
    scheme = kind;
    list += (list.empty() ? "" : ",") + backend;
    backends->push_back(backend);
  }
  return scheme + list;
}

// One channel per target balancing calls round_robin over every address its name resolves to (a
// headless Service's pods, or a '+' list): gRPC keeps one long-lived connection per backend, so
// pick_first (gRPC's default) would send every call to one replica.
StatusOr<std::vector<Target>> ParseTargets(const std::string& spec,
                                           const std::shared_ptr<grpc::ChannelCredentials>& creds) {
  std::vector<Target> targets;
  for (const std::string& item : Split(spec)) {
    const size_t eq = item.find('=');
    Target t;
    t.label = eq == std::string::npos ? item : item.substr(0, eq);
    t.address = eq == std::string::npos ? item : item.substr(eq + 1);
    if (t.label.empty() || t.address.empty()) {
      return InvalidArgumentError(StrCat("--targets: '", item, "' is not LABEL=HOST:PORT"));
    }
    ASSIGN_OR_RETURN(const std::string uri, ChannelTarget(t.address, &t.backends));
    grpc::ChannelArguments args;
    args.SetLoadBalancingPolicyName("round_robin");
    t.channel = grpc::CreateCustomChannel(uri, creds, args);
    t.stub = v1::Generation::NewStub(t.channel);
    targets.push_back(std::move(t));
  }
  if (targets.empty()) return InvalidArgumentError("--targets is empty");
  return targets;
}

double Median(std::vector<double> v) { return Percentile(std::move(v), 50); }

bool HasTokenizer(const fs::path& dir) {
  std::error_code ec;
  return !dir.empty() && fs::is_regular_file(dir / "tokenizer.json", ec);
}

fs::path BinaryDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

// --model if given (it must hold tokenizer.json); else the model path the server reports, if
// readable here; else the bundled model of the checkout the binary was built in.
StatusOr<fs::path> ResolveModel(const std::string& flag, const std::string& server_path) {
  if (!flag.empty()) {
    if (HasTokenizer(flag)) return fs::path(flag);
    return InvalidArgumentError(StrCat("--model ", flag, ": no tokenizer.json there (cwd ",
                                       fs::current_path().string(), ")"));
  }
  std::vector<fs::path> tried;
  if (!server_path.empty()) tried.push_back(server_path);
  const fs::path bin = BinaryDir();
  if (!bin.empty()) tried.push_back((bin / "../.." / kBundledModel).lexically_normal());
  for (const fs::path& p : tried) {
    if (HasTokenizer(p)) return p;
  }
  std::string list;
  for (const fs::path& p : tried) list += (list.empty() ? "" : ", ") + p.string();
  return InvalidArgumentError(StrCat(
      "--model DIR is required: the directory whose tokenizer.json encodes the prompts (looked "
      "for one in: ",
      list.empty() ? "nothing" : list, ")"));
}

// The arrival rate as vLLM writes it in file names: Python's str(float).
std::string RateWord(double rate) {
  if (rate <= 0 || std::isinf(rate)) return "inf";
  if (rate == std::floor(rate)) return StrCat(static_cast<int64_t>(rate), ".0");
  return PercentileWord(rate);
}

std::string Now(const char* format) {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), format, &tm);
  return buf;
}

StatusOr<std::vector<SampleRequest>> LoadDataset(const Flags& f, const Tokenizer& tokenizer,
                                                 const std::string& name, int64_t count) {
  const std::string& path = !f.dataset_path.empty() ? f.dataset_path : f.prompts;
  if (name == "jsonl") {
    if (path.empty()) return InvalidArgumentError("--dataset-name jsonl needs --dataset-path");
    return LoadJsonlDataset(tokenizer, path);
  }
  if (name == "sharegpt") {
    if (path.empty()) return InvalidArgumentError("--dataset-name sharegpt needs --dataset-path");
    return LoadShareGptDataset(tokenizer, path);
  }
  if (name == "random") {
    return RandomDataset(
        tokenizer, {.num_prompts = count,
                    .input_len = f.random_input_len > 0 ? f.random_input_len : f.prompt_tokens,
                    .output_len = f.random_output_len > 0 ? f.random_output_len : f.max_new_tokens,
                    .range_ratio = f.random_range_ratio,
                    .seed = static_cast<uint64_t>(f.seed)});
  }
  if (name == "heldout") {
    const std::string dir = !f.dataset_path.empty() ? f.dataset_path : f.prompt_dir;
    ASSIGN_OR_RETURN(auto prompts, cli::HeldOutPrompts(tokenizer, dir, count, f.prompt_tokens));
    std::vector<SampleRequest> out;
    for (auto& p : prompts) out.push_back({std::move(p), 0});
    if (f.random_range_ratio != 0) {  // a bad ratio is an error, not ignored
      RETURN_IF_ERROR(SpreadOutputLengths(out, f.max_new_tokens, f.random_range_ratio,
                                          static_cast<uint64_t>(f.seed)));
    }
    return out;
  }
  return InvalidArgumentError(
      StrCat("--dataset-name: '", name, "' is not one of heldout, jsonl, sharegpt, random"));
}

// The file a run's flat result goes to: --result-filename (suffixed with the run when there are
// several), or vLLM's {label}-{rate}qps-concurrency{c}-{model}-{date}.json.
fs::path ResultPath(const Flags& f, bool single, const std::string& label,
                    const std::string& run_tag, int64_t concurrency, const std::string& model_id,
                    const std::string& date) {
  std::string name;
  if (!f.result_filename.empty()) {
    name = f.result_filename;
    if (!single) {
      const fs::path p(name);
      name = p.stem().string() + "-" + run_tag + (p.has_extension() ? p.extension().string() : "");
    }
  } else {
    const std::string rate =
        f.ramp_up_strategy.empty()
            ? RateWord(f.request_rate) + "qps"
            : StrCat("ramp-up-", f.ramp_up_strategy, "-", RateWord(f.ramp_up_start_rps), "qps-",
                     RateWord(f.ramp_up_end_rps), "qps");
    name = StrCat(label, "-", rate, "-concurrency", concurrency, "-", model_id, "-", date, ".json");
  }
  return f.result_dir.empty() ? fs::path(name) : fs::path(f.result_dir) / name;
}

Status WriteJson(const fs::path& path, const nlohmann::json& j, int indent) {
  if (path.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(path.parent_path(), ec);
    if (ec) return InternalError(StrCat("cannot create ", path.parent_path().string()));
  }
  std::ofstream file(path);
  file << j.dump(indent) << "\n";
  if (!file) return InternalError(StrCat("cannot write ", path.string()));
  return OkStatus();
}

// vLLM's "Serving Benchmark Result" block, for a single setting.
void PrintResultBlock(const nlohmann::json& r, const ReportOptions& report) {
  auto line = [](const std::string& name, const nlohmann::json& v) {
    if (v.is_number_float()) {
      std::printf("%-40s %-10.2f\n", name.c_str(), v.get<double>());
    } else {
      std::printf("%-40s %-10s\n", name.c_str(), v.dump().c_str());
    }
  };
  std::printf("============ Serving Benchmark Result ============\n");
  line("Successful requests:", r["completed"]);
  line("Failed requests:", r["failed"]);
  line("Maximum request concurrency:", r["max_concurrency"]);
  line("Benchmark duration (s):", r["duration"]);
  line("Total input tokens:", r["total_input_tokens"]);
  line("Total generated tokens:", r["total_output_tokens"]);
  line("Request throughput (req/s):", r["request_throughput"]);
  if (!r["request_goodput"].is_null()) line("Request goodput (req/s):", r["request_goodput"]);
  line("Output token throughput (tok/s):", r["output_throughput"]);
  line("Total Token throughput (tok/s):", r["total_token_throughput"]);
  line("Mean accepted length (tokens/step):", r["mean_accepted_len"]);
  const std::map<std::string, std::string> names = {{"ttft", "TTFT"},
                                                    {"tpot", "TPOT"},
                                                    {"itl", "ITL"},
                                                    {"token_itl", "Token ITL"},
                                                    {"e2el", "E2EL"}};
  for (const std::string& m : report.percentile_metrics) {
    std::printf("%s\n", ("-------------------- " + names.at(m) + " --------------------").c_str());
    line("Mean " + names.at(m) + " (ms):", r["mean_" + m + "_ms"]);
    line("Median " + names.at(m) + " (ms):", r["median_" + m + "_ms"]);
    for (double p : report.percentiles) {
      const std::string w = PercentileWord(p);
      line("P" + w + " " + names.at(m) + " (ms):", r["p" + w + "_" + m + "_ms"]);
    }
  }
  std::printf("==================================================\n");
}

// A failure the request's own settings asked for: its cancel_after_ms or timeout_ms.
bool AskedFor(const SampleRequest& request, const RequestRecord& r) {
  return (request.overrides.cancel_after_s > 0 && r.status_code == grpc::StatusCode::CANCELLED) ||
         (request.overrides.timeout_s > 0 && r.status_code == grpc::StatusCode::DEADLINE_EXCEEDED);
}

// The per-request lists of a flat result, left out of the --json summary's rows.
const std::vector<std::string> kPerRequestKeys = {"input_lens", "output_lens",   "ttfts",
                                                  "itls",       "itl_tokens",    "generated_texts",
                                                  "errors",     "finish_reasons"};

Status Run(const Flags& f, const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> creds, ChannelCredentials(f));
  ASSIGN_OR_RETURN(const std::string authorization, Authorization(f));
  ASSIGN_OR_RETURN(std::vector<Target> targets, ParseTargets(f.targets, creds));
  const std::vector<std::string> drafters = Split(f.drafters);
  if (drafters.empty()) return InvalidArgumentError("--drafters is empty");
  if (f.repeats < 1) return InvalidArgumentError("--repeats must be at least 1");
  if (f.concurrency.empty()) return InvalidArgumentError("--concurrency is empty");
  for (int64_t c : f.concurrency) {
    if (c < 1) return InvalidArgumentError(StrCat("--concurrency values must be >= 1, got ", c));
  }
  if (f.num_warmups < 0) return InvalidArgumentError("--num-warmups must be >= 0");
  ReportOptions report;
  ASSIGN_OR_RETURN(report.percentiles, ParseMetricPercentiles(f.metric_percentiles));
  ASSIGN_OR_RETURN(report.percentile_metrics, ParsePercentileMetrics(f.percentile_metrics));
  ASSIGN_OR_RETURN(report.goodput, ParseGoodput(f.goodput));
  if (f.slo_ttft_ms > 0) report.goodput["ttft"] = f.slo_ttft_ms;
  if (f.slo_tpot_ms > 0) report.goodput["tpot"] = f.slo_tpot_ms;
  if (f.slo_e2el_ms > 0) report.goodput["e2el"] = f.slo_e2el_ms;
  ArrivalOptions arrivals{.request_rate = f.request_rate,
                          .burstiness = f.burstiness,
                          .ramp_up_strategy = f.ramp_up_strategy,
                          .ramp_up_start_rps = f.ramp_up_start_rps,
                          .ramp_up_end_rps = f.ramp_up_end_rps};
  RETURN_IF_ERROR(ValidateArrivals(arrivals));
  const std::string dataset_name =
      !f.dataset_name.empty() ? f.dataset_name : (f.prompts.empty() ? "heldout" : "jsonl");
  // As vLLM: the random dataset always generates its full output lengths.
  const bool ignore_eos = f.ignore_eos || dataset_name == "random";
  const bool show_progress = ProgressBar::Enabled(f.disable_tqdm, f.progress);

  // 1-2. Readiness, then the served model.
  for (const Target& t : targets) {
    if (t.backends.size() == 1) {
      RETURN_IF_ERROR(WaitForServing(t.channel, t.address, f.ready_check_timeout_s));
      continue;
    }
    for (const std::string& backend : t.backends) {  // each replica, not whichever answers
      RETURN_IF_ERROR(
          WaitForServing(grpc::CreateChannel(backend, creds), backend, f.ready_check_timeout_s));
    }
  }
  v1::ServerInfo info;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    if (!authorization.empty()) context.AddMetadata("authorization", authorization);
    grpc::Status s = targets[0].stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
    if (!s.ok()) {
      std::fprintf(stderr, "specula-loadgen: GetServerInfo on %s failed (%s); continuing\n",
                   targets[0].address.c_str(), s.error_message().c_str());
    }
  }
  ASSIGN_OR_RETURN(fs::path model_dir, ResolveModel(f.model, info.model_path()));
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                   Tokenizer::FromFile((model_dir / "tokenizer.json").string()));
  const std::string model_id =
      !info.model_name().empty() ? info.model_name() : model_dir.filename().string();

  // 3. The dataset and the warm-up.
  const int64_t most = *std::max_element(f.concurrency.begin(), f.concurrency.end());
  auto count_for = [&](int64_t c) {
    return f.num_prompts > 0 ? f.num_prompts : std::max<int64_t>(8, 2 * c);
  };
  ASSIGN_OR_RETURN(std::vector<SampleRequest> all,
                   LoadDataset(f, *tokenizer, dataset_name, count_for(most)));
  if (all.empty()) return InvalidArgumentError("no prompts");
  LoadOptions base;
  base.max_new_tokens = static_cast<int32_t>(f.max_new_tokens);
  base.ignore_eos = ignore_eos;
  base.max_draft_tokens = static_cast<int32_t>(f.draft_len);
  base.temperature = static_cast<float>(f.temperature);
  base.timeout_s = f.timeout_s;
  base.authorization = authorization;
  if (f.num_warmups > 0) {
    // Each target, with each speculation setting: a drafter's first requests on a server are
    // when its budget learns its costs and acceptance (and its audit gives its first verdict),
    // which a run measuring it should not include. The prompts and lengths are the dataset's, in
    // turn, without its per-request settings (a JSONL line's timeout or drafter is its own).
    std::vector<SampleRequest> warmups;
    for (int64_t i = 0; i < f.num_warmups; ++i) {
      const SampleRequest& sample = all[static_cast<size_t>(i) % all.size()];
      warmups.push_back({.prompt_ids = sample.prompt_ids, .output_len = sample.output_len});
    }
    for (const Target& t : targets) {
      for (const std::string& drafter : drafters) {
        LoadOptions o = base;
        o.concurrency = static_cast<int32_t>(std::min(f.num_warmups, most));
        o.drafter = drafter == "default" ? "" : drafter;
        std::unique_ptr<ProgressBar> bar;
        if (show_progress) {
          bar = std::make_unique<ProgressBar>(stderr, "  warm-up " + t.label + " " + drafter,
                                              f.num_warmups);
          o.progress = bar.get();
        }
        double ignored = 0;
        auto records = RunLoad(*t.stub, warmups, o, &ignored);
        for (const RequestRecord& r : records) {
          if (!r.ok) {
            return UnavailableError(
                StrCat("warm-up on ", t.label, " (", drafter, ") failed: ", r.error));
          }
        }
      }
    }
  }

  // 4. The measured runs.
  const bool single =
      targets.size() * drafters.size() * f.concurrency.size() * static_cast<size_t>(f.repeats) == 1;
  const bool save_results = !f.result_dir.empty() || !f.result_filename.empty();
  const bool has_none = std::find(drafters.begin(), drafters.end(), "none") != drafters.end();
  const std::string date = Now("%Y%m%d-%H%M%S");
  std::vector<std::string> result_files;
  std::vector<nlohmann::json> flat_results;
  nlohmann::json results = nlohmann::json::array();
  std::string failures;
  // ITL column: the last requested percentile when ITL percentiles are on, else the median; a
  // per-token ITL column when its percentiles are asked for.
  auto chosen = [&](const std::string& metric) {
    return std::find(report.percentile_metrics.begin(), report.percentile_metrics.end(), metric) !=
           report.percentile_metrics.end();
  };
  const std::string top = PercentileWord(report.percentiles.back());
  const bool itl_percentile = chosen("itl"), token_itl_column = chosen("token_itl");
  const std::string itl_key = itl_percentile ? "p" + top + "_itl_ms" : "median_itl_ms";
  const std::string itl_header = itl_percentile ? "ITL p" + top : "ITL med";
  const std::string token_itl_key = "p" + top + "_token_itl_ms";
  const std::string token_itl_header = "tokITL p" + top;
  std::printf("%-8s %-12s %5s %10s %10s ", "target", "drafter", "conc", "tok/s med", "tok/s min");
  if (has_none) std::printf("%9s %9s ", "vs none", "paired");
  std::printf("%9s %9s %9s %9s ", "vs first", "TTFT ms", "TPOT ms", itl_header.c_str());
  if (token_itl_column) std::printf("%11s ", token_itl_header.c_str());
  std::printf("%6s %6s\n", "a", "fail");
  for (int64_t c : f.concurrency) {
    std::vector<SampleRequest> requests;
    for (int64_t i = 0; i < count_for(c); ++i) {
      requests.push_back(all[static_cast<size_t>(i) % all.size()]);
    }
    // Settings in rotated order each repeat, all on the same requests.
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
      ArrivalOptions a = arrivals;
      a.seed = static_cast<uint64_t>(f.seed + rep);
      const std::vector<double> arrival_s = ArrivalTimes(static_cast<int64_t>(requests.size()), a);
      for (size_t k = 0; k < settings.size(); ++k) {
        Setting& s = settings[(k + static_cast<size_t>(rep)) % settings.size()];
        const Target& target = targets[s.target];
        LoadOptions o = base;
        o.concurrency = static_cast<int32_t>(c);
        o.arrival_s = arrival_s;
        o.drafter = s.drafter == "default" ? "" : s.drafter;
        const std::string run_name =
            StrCat(target.label, " ", s.drafter, " c=", c, " repeat ", rep + 1, "/", f.repeats);
        std::unique_ptr<ProgressBar> bar;
        if (show_progress) {
          bar = std::make_unique<ProgressBar>(stderr, "  " + run_name,
                                              static_cast<int64_t>(requests.size()));
          o.progress = bar.get();
        }
        double duration = 0;
        auto records = RunLoad(*target.stub, requests, o, &duration);
        bar.reset();
        // The flat vLLM result object: the run's settings, then the measurements.
        nlohmann::json run = Summarize(records, duration, report);
        run["date"] = date;
        run["endpoint_type"] = "specula-grpc";
        run["backend"] = "specula";
        run["label"] = StrCat(target.label, "-", s.drafter);
        run["model_id"] = model_id;
        run["tokenizer_id"] = model_dir.string();
        run["num_prompts"] = requests.size();
        run["request_rate"] = f.request_rate > 0 && !std::isinf(f.request_rate)
                                  ? nlohmann::json(f.request_rate)
                                  : nlohmann::json("inf");
        run["burstiness"] = f.burstiness;
        run["max_concurrency"] = c;
        if (!f.ramp_up_strategy.empty()) {
          run["ramp_up_strategy"] = f.ramp_up_strategy;
          run["ramp_up_start_rps"] = f.ramp_up_start_rps;
          run["ramp_up_end_rps"] = f.ramp_up_end_rps;
        }
        for (const auto& [key, value] : metadata) run[key] = value;
        run["target"] = target.label;
        run["address"] = target.address;
        run["drafter"] = s.drafter;
        run["max_draft_tokens"] = f.draft_len;
        run["repeat"] = rep + 1;
        run["seed"] = f.seed + rep;
        run["dataset_name"] = dataset_name;
        run["ignore_eos"] = ignore_eos;
        run["max_new_tokens"] = f.max_new_tokens;
        run["temperature"] = f.temperature;
        run["num_warmups"] = f.num_warmups;
        std::fprintf(stderr, "  %s: %.1f tok/s, %lld failed\n", run_name.c_str(),
                     run["output_throughput"].get<double>(), run["failed"].get<long long>());
        for (size_t i = 0; i < records.size(); ++i) {
          const RequestRecord& r = records[i];
          if (!r.ok && !AskedFor(requests[i], r) && failures.size() < 400) {
            failures += StrCat(failures.empty() ? "" : "; ", target.label, ": ", r.error);
          }
        }
        if (save_results) {
          // Repeats share every other part of vLLM's name: they get -rN.
          const std::string file_label =
              StrCat("specula-", run["label"].get<std::string>(),
                     f.repeats > 1 ? StrCat("-r", rep + 1) : std::string());
          const fs::path path = ResultPath(
              f, single, file_label, StrCat(target.label, "-", s.drafter, "-c", c, "-r", rep + 1),
              c, model_id, date);
          RETURN_IF_ERROR(WriteJson(path, run, -1));
          result_files.push_back(path.string());
        }
        if (single) flat_results.push_back(run);
        for (const std::string& key : kPerRequestKeys) run.erase(key);
        s.runs.push_back(std::move(run));
      }
    }
    std::map<std::pair<size_t, std::string>, double> median_of;
    std::map<size_t, const Setting*> none_of;  // per target
    for (Setting& s : settings) {
      std::vector<double> tps;
      for (const auto& r : s.runs) tps.push_back(r["output_throughput"].get<double>());
      median_of[{s.target, s.drafter}] = Median(tps);
      if (s.drafter == "none") none_of[s.target] = &s;
    }
    // Each repeat's `key` over the same repeat's run without speculation on the same target: the
    // runs of a repeat are minutes apart at most, its repeats further, and a shared machine's
    // speed drifts by 10-20% in between (empty without a `none` run or the key).
    auto paired = [&](const Setting& s, const std::string& key) {
      std::vector<double> ratios;
      auto it = none_of.find(s.target);
      if (it == none_of.end()) return ratios;
      const std::vector<nlohmann::json>& none = it->second->runs;
      for (size_t i = 0; i < s.runs.size() && i < none.size(); ++i) {
        const double base = none[i].value(key, 0.0);
        if (base > 0 && s.runs[i].contains(key)) {
          ratios.push_back(s.runs[i][key].get<double>() / base);
        }
      }
      return ratios;
    };
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
      const double none = has_none ? median_of[{s.target, "none"}] : 0;
      const double vs_none = none > 0 ? med / none : 0;
      const double first = median_of[{0, s.drafter}];
      const double vs_first = first > 0 ? med / first : 0;
      int64_t failed = 0;
      for (const auto& r : s.runs) failed += r["failed"].get<int64_t>();
      std::printf("%-8s %-12s %5lld %10.1f %10.1f ", targets[s.target].label.c_str(),
                  s.drafter.c_str(), static_cast<long long>(c), med,
                  *std::min_element(tps.begin(), tps.end()));
      const std::vector<double> paired_tps = paired(s, "output_throughput");
      const double paired_median = paired_tps.empty() ? 0 : Median(paired_tps);
      if (has_none) std::printf("%8.2fx %8.2fx ", vs_none, paired_median);
      std::printf("%8.3fx %9.1f %9.2f %9.2f ", vs_first, rep["mean_ttft_ms"].get<double>(),
                  rep["mean_tpot_ms"].get<double>(), rep.value(itl_key, 0.0));
      if (token_itl_column) std::printf("%11.2f ", rep.value(token_itl_key, 0.0));
      std::printf("%6.2f %6lld\n", rep["mean_accepted_len"].get<double>(),
                  static_cast<long long>(failed));
      nlohmann::json row = rep;
      row["concurrency"] = c;
      row["output_throughput_median"] = med;
      row["output_throughput_min"] = *std::min_element(tps.begin(), tps.end());
      row["output_throughput_repeats"] = tps;
      // Every repeat's latencies too, so that a comparison can pair repeats instead of trusting
      // the one repeat that stands for them (on a shared machine they swing 10-20% apiece).
      for (const char* key : {"mean_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms",
                              "p99_itl_ms", "mean_token_itl_ms", "p99_token_itl_ms"}) {
        std::vector<double> values;
        for (const auto& r : s.runs) {
          if (r.contains(key)) values.push_back(r[key].get<double>());
        }
        if (values.size() != s.runs.size()) continue;
        row[StrCat(key, "_repeats")] = values;
        row[StrCat(key, "_median")] = Median(values);
      }
      if (has_none) {
        row["speedup_vs_none"] = vs_none;
        // Paired by repeat (see `paired`): tokens/s over none's, TPOT and ITL over none's.
        row["speedup_vs_none_repeats"] = paired_tps;
        if (!paired_tps.empty()) {
          row["speedup_vs_none_paired_median"] = paired_median;
          row["speedup_vs_none_paired_min"] =
              *std::min_element(paired_tps.begin(), paired_tps.end());
        }
        for (const auto& [key, name] :
             {std::pair<std::string, std::string>{"mean_tpot_ms", "tpot"}, {itl_key, "itl"}}) {
          const std::vector<double> ratios = paired(s, key);
          if (ratios.empty()) continue;
          row[StrCat(name, "_vs_none_repeats")] = ratios;
          row[StrCat(name, "_vs_none_paired_median")] = Median(ratios);
        }
      }
      row["ratio_vs_first_target"] = vs_first;
      results.push_back(row);
    }
    std::fflush(stdout);
  }
  if (single) PrintResultBlock(flat_results[0], report);

  // 5. The summary and the charts.
  if (!f.json.empty()) {
    nlohmann::json out = {{"max_new_tokens", f.max_new_tokens},
                          {"prompt_tokens", dataset_name == "heldout" ? f.prompt_tokens : -1},
                          {"prompts", dataset_name == "heldout"
                                          ? (f.dataset_path.empty() ? f.prompt_dir : f.dataset_path)
                                          : (f.dataset_path.empty() ? f.prompts : f.dataset_path)},
                          {"dataset_name", dataset_name},
                          {"model_id", model_id},
                          {"date", date},
                          {"request_rate", f.request_rate},
                          {"burstiness", f.burstiness},
                          {"ignore_eos", ignore_eos},
                          {"repeats", f.repeats},
                          {"temperature", f.temperature},
                          {"results", results}};
    for (const auto& [key, value] : metadata) out[key] = value;
    RETURN_IF_ERROR(WriteJson(f.json, out, 2));
  }
  for (const std::string& file : result_files) std::fprintf(stderr, "wrote %s\n", file.c_str());
  if (f.plot) {
    std::vector<std::string> inputs;
    fs::path out_dir;
    if (!f.json.empty()) {
      inputs = {f.json};
      out_dir = fs::path(f.json).parent_path();
    } else if (!result_files.empty()) {
      inputs = result_files;
      out_dir = fs::path(result_files[0]).parent_path();
    } else {
      return InvalidArgumentError("--plot needs --json or --result-dir to draw from");
    }
    std::string script = f.plot_script;
    if (script.empty()) {
      const fs::path beside = (BinaryDir() / "../../scripts/plot_loadgen.py").lexically_normal();
      script = fs::exists(beside) ? beside.string() : SPECULA_LOADGEN_PLOT_SCRIPT;
    }
    std::string command = "/usr/bin/python3 '" + script + "' --out-dir '" +
                          (out_dir.empty() ? std::string(".") : out_dir.string()) + "'";
    for (const std::string& in : inputs) command += " '" + in + "'";
    std::fflush(stdout);
    if (std::system(command.c_str()) != 0) {
      return InternalError(StrCat("--plot: '", command,
                                  "' failed (needs python3-matplotlib: sudo apt-get install -y "
                                  "python3-matplotlib)"));
    }
  }
  // Failed requests make the run fail, so scripts notice (except the cancels and deadlines the
  // dataset asked for).
  if (!failures.empty()) return UnavailableError(StrCat("requests failed: ", failures));
  return OkStatus();
}

}  // namespace
}  // namespace specula::loadgen

int main(int argc, char** argv) {
  using specula::loadgen::Flags;
  Flags f;
  specula::FlagSet flags("specula-loadgen");
  flags.AddString("targets", &f.targets,
                  "comma-separated LABEL=ADDRESS routers to measure; ADDRESS is HOST:PORT, a "
                  "gRPC URI (dns:///NAME:PORT) or IP:PORT+IP:PORT+... (one deployment's "
                  "replicas); calls are balanced round_robin over every address");
  flags.AddString("tls-ca", &f.tls_ca,
                  "connect with TLS, trusting this PEM CA bundle (specula serve --tls-cert)");
  flags.AddString("tls-cert", &f.tls_cert,
                  "with --tls-ca: PEM client certificate (specula serve --tls-ca)");
  flags.AddString("tls-key", &f.tls_key, "with --tls-ca: PEM private key of --tls-cert");
  flags.AddString("api-token-file", &f.api_token_file,
                  "send 'authorization: Bearer <the file's token>' on every call (default: "
                  "$SPECULA_API_TOKEN if set)");
  flags.AddString("model", &f.model,
                  "model directory whose tokenizer.json encodes the prompts (default: the "
                  "server's model path if readable here, else models/pyllama-6m of the checkout "
                  "the binary was built in)");
  flags.AddString("dataset-name", &f.dataset_name,
                  "heldout, jsonl, sharegpt or random (default: jsonl with --prompts, else "
                  "heldout)");
  flags.AddString("dataset-path", &f.dataset_path,
                  "the jsonl / sharegpt file, or the heldout directory");
  flags.AddString("prompts", &f.prompts,
                  "JSONL prompts (same as --dataset-name jsonl "
                  "--dataset-path FILE)");
  flags.AddString("prompt-dir", &f.prompt_dir, "held-out .py files to cut prompts from");
  flags.AddInt("num-prompts", &f.num_prompts, "requests per run (0 = 2 x concurrency, at least 8)");
  flags.AddInt("prompt-tokens", &f.prompt_tokens, "tokens per held-out prompt");
  flags.AddInt("max-new-tokens", &f.max_new_tokens,
               "tokens generated per request when the dataset gives no output length");
  flags.AddInt("random-input-len", &f.random_input_len,
               "random dataset: prompt tokens (0 = --prompt-tokens)");
  flags.AddInt("random-output-len", &f.random_output_len,
               "random dataset: output tokens (0 = --max-new-tokens)");
  flags.AddDouble("random-range-ratio", &f.random_range_ratio,
                  "random dataset: lengths uniform in [len * (1 - r), len * (1 + r)], r in [0, 1); "
                  "heldout: each request's output length so, around --max-new-tokens");
  flags.AddIntList("concurrency", &f.concurrency,
                   "concurrent requests at most (vLLM's --max-concurrency), one run each");
  flags.AddIntList("max-concurrency", &f.concurrency, "same as --concurrency");
  flags.AddString("drafters", &f.drafters,
                  "comma-separated speculation settings per request: none, default, or a drafter");
  flags.AddInt("draft-len", &f.draft_len, "max_draft_tokens per request (0 = server default)");
  flags.AddDouble("request-rate", &f.request_rate,
                  "arrivals per second (0 or inf = all at once, paced by the concurrency)");
  flags.AddDouble("burstiness", &f.burstiness,
                  "gamma shape of the arrival intervals (1 = Poisson, < 1 burstier, inf = even)");
  flags.AddString(
      "ramp-up-strategy", &f.ramp_up_strategy,
      "linear: the rate goes from --ramp-up-start-rps to --ramp-up-end-rps over the run");
  flags.AddDouble("ramp-up-start-rps", &f.ramp_up_start_rps, "ramp-up: first request rate");
  flags.AddDouble("ramp-up-end-rps", &f.ramp_up_end_rps, "ramp-up: last request rate");
  flags.AddInt("seed", &f.seed, "seed of the arrival times (+ repeat) and the random dataset");
  flags.AddInt("repeats", &f.repeats, "runs per setting (median and min reported)");
  flags.AddDouble("temperature", &f.temperature, "sampling temperature (0 = greedy)");
  flags.AddBool("ignore-eos", &f.ignore_eos,
                "generate every output length in full, past end-of-sequence (always on with "
                "--dataset-name random, as in vLLM)");
  flags.AddInt("num-warmups", &f.num_warmups,
               "requests sent per target and speculation setting (--drafters) before measuring, "
               "the dataset's prompts in turn");
  flags.AddDouble("ready-check-timeout-sec", &f.ready_check_timeout_s,
                  "wait this long for every target's health service to say SERVING (0 = skip)");
  flags.AddDouble("request-timeout-sec", &f.timeout_s, "deadline of each request");
  flags.AddBool("disable-tqdm", &f.disable_tqdm, "no progress bars");
  flags.AddBool("progress", &f.progress, "progress bars on stderr even when it is not a terminal");
  flags.AddString("metric-percentiles", &f.metric_percentiles,
                  "comma-separated percentiles reported for --percentile-metrics");
  flags.AddString("percentile-metrics", &f.percentile_metrics,
                  "comma-separated metrics with percentiles: ttft, tpot, itl (per streamed chunk, "
                  "as vLLM), token_itl (per token: a chunk of n tokens is n gaps of 1/n), e2el");
  std::string multi_value_help;  // --goodput and --metadata are taken before Parse (nargs)
  flags.AddString("goodput", &multi_value_help,
                  "SLOs as KEY:VALUE ... in ms (ttft, tpot, e2el), e.g. --goodput ttft:200 "
                  "tpot:50; request_goodput is null without any");
  flags.AddString("metadata", &multi_value_help,
                  "KEY=VALUE ... pairs saved in every result object and the --json summary");
  flags.AddDouble("goodput-ttft-ms", &f.slo_ttft_ms, "same as --goodput ttft:MS (0 = none)");
  flags.AddDouble("goodput-tpot-ms", &f.slo_tpot_ms, "same as --goodput tpot:MS (0 = none)");
  flags.AddDouble("goodput-e2el-ms", &f.slo_e2el_ms, "same as --goodput e2el:MS (0 = none)");
  flags.AddString("json", &f.json, "write the comparison summary (one row per setting) here");
  flags.AddString("result-dir", &f.result_dir,
                  "write one flat vLLM result object per run into this directory");
  flags.AddString("result-filename", &f.result_filename,
                  "the result file's name (several runs: suffixed -TARGET-DRAFTER-cC-rR); default "
                  "vLLM's {label}-{rate}qps-concurrency{c}-{model}-{date}.json");
  flags.AddBool("plot", &f.plot,
                "draw PNG charts next to the --json file (or the result files) with "
                "scripts/plot_loadgen.py");
  flags.AddString("plot-script", &f.plot_script, "the plot script to run for --plot");
  std::vector<std::string> args(argv + 1, argv + argc);
  f.goodput = specula::loadgen::TakeMultiValue(args, "goodput");
  f.metadata = specula::loadgen::TakeMultiValue(args, "metadata");
  specula::Status parsed = flags.Parse(args);
  if (flags.help_requested()) {
    // The FlagSet's banner names `specula COMMAND`; this is a program of its own.
    const std::string usage = flags.Usage();
    std::printf("usage: specula-loadgen [flags]\n%s", usage.substr(usage.find('\n') + 1).c_str());
    return 0;
  }
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", parsed.ToString().c_str());
    return 1;
  }
  std::map<std::string, std::string> metadata;
  for (const std::string& item : f.metadata) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::fprintf(stderr, "specula-loadgen: --metadata: '%s' is not KEY=VALUE\n", item.c_str());
      return 1;
    }
    metadata[item.substr(0, eq)] = item.substr(eq + 1);
  }
  specula::Status status = specula::loadgen::Run(f, metadata);
  if (!status.ok()) {
    std::fprintf(stderr, "specula-loadgen: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
