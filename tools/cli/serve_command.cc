// specula serve: the gRPC servers.
//   --role all (default)  router + target + drafters in one process, in-process transport
//   --role router         the public Generation API; steps run on --target-address
//   --role target         the verifier (target model, KV cache); drafters from --drafter-address
//                         (or loaded locally when it is empty)
//   --role drafter        the drafter models for a remote target
// Every server answers gRPC health checks and reflection; router, target and drafter alike stop
// cleanly on SIGINT/SIGTERM.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/model/model_config.h"
#include "common/spec/local_target_backend.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/log.h"
#include "services/common/metrics_registry.h"
#include "services/common/service_server.h"
#include "services/drafter/drafter_service.h"
#include "services/router/remote_target_backend.h"
#include "services/router/router_server.h"
#include "services/target/remote_drafter.h"
#include "services/target/target_service.h"
#include "tools/cli/commands.h"
#include "tools/cli/model_flags.h"
#include "tools/cli/serve_security_flags.h"
#include "tools/cli/spec_flags.h"

namespace specula::cli {
namespace {

constexpr char kCommand[] = "serve";

// --help sections: which role reads each flag (a flag of several roles is listed once, under the
// first that reads it; its help names the others).
const std::vector<std::pair<std::string, std::vector<const char*>>> kHelpSections = {
    {"flags for every role",
     {"role", "host", "port", "metrics-port", "shutdown-grace-s", "log-level", "model", "device",
      "dtype", "threads", "cpu-packed-weights"}},
    {"router flags (--role router, all)",
     {"target-address", "connect-timeout-s", "target-step-deadline-s", "max-prompt-bytes",
      "max-request-bytes", "max-queue", "max-batch-size", "default-drafter", "verify", "beta",
      "tau", "typical-epsilon", "typical-delta", "overlap-steps", "log-stats-interval-s"}},
    {"draft budget flags (--role router, all)",
     {"draft-budget", "draft-len", "draft-cap", "max-draft-slowdown", "max-prefill-step-slowdown",
      "prune-drafts", "draft-margin", "draft-audit", "cost-profile", "step-trace"}},
    {"target flags (--role target, all)",
     {"kv-memory-mb", "kv-block-size", "max-step-tokens", "verify-placement", "drafter-address",
      "drafter-deadline-ms", "drafter-context"}},
    {"security flags (TLS on the public API, mutual TLS between the services, bearer token)",
     {"tls-cert", "tls-key", "tls-ca", "api-token-file", "peer-tls-cert", "peer-tls-key",
      "peer-tls-ca"}},
    {"drafter flags (--role drafter; target and all with local drafters)",
     {"drafter",
      "proposal-top-k",
      "drafter-model",
      "specformer-model",
      "specformer-tree",
      "parallelspec-model",
      "parallelspec-static-tree",
      "specdec-model",
      "beagle-model",
      "beagle-depth",
      "beagle-top-k",
      "beagle-total-tokens",
      "beagle-concat",
      "beagle-rank-temperature",
      "tree-width",
      "ngram-min",
      "ngram-max",
      "ngram-repeat-min-match",
      "draft-vocab",
      "draft-model-context",
      "drafter-matmul"}},
};

struct ServeFlags {
  std::string role = "all";
  std::string host = "127.0.0.1";
  int64_t port = 50051;
  int64_t metrics_port = 9464;
  ModelFlags model;
  SpecFlags spec;
  std::string default_drafter;
  int64_t draft_len = 4;
  int64_t max_batch_size = 64;
  int64_t max_queue = 256;
  double shutdown_grace_s = 5;
  std::string target_address;
  std::string drafter_address;
  double connect_timeout_s = 60;
  int64_t drafter_deadline_ms = target::DrafterConnection::kDefaultCallDeadline.count();
  int64_t proposal_top_k = drafter::kDefaultProposalTopK;
  double target_step_deadline_s =
      router::RemoteTargetBackend::kDefaultStepDeadline.count() / 1000.0;
  int64_t max_prompt_bytes = router::kDefaultMaxPromptBytes;
  int64_t max_request_bytes = router::kDefaultMaxRequestBytes;
  ServeSecurityFlags security;  // TLS, mutual TLS between the services, bearer token
  std::string log_level = "info";
  double log_stats_interval_s = 10;
  std::string overlap_steps = "auto";
};

Status CheckRole(const ServeFlags& f) {
  if (f.role != "all" && f.role != "router" && f.role != "target" && f.role != "drafter") {
    return InvalidArgumentError(
        StrCat("--role must be all, router, target or drafter, got '", f.role, "'"));
  }
  if (f.role == "router" && f.target_address.empty()) {
    return InvalidArgumentError("--role router needs --target-address HOST:PORT");
  }
  if (f.role != "router" && !f.target_address.empty()) {
    return InvalidArgumentError("--target-address is for --role router");
  }
  if (f.overlap_steps != "auto" && f.overlap_steps != "true" && f.overlap_steps != "false") {
    return InvalidArgumentError(
        StrCat("--overlap-steps must be auto, true or false, got '", f.overlap_steps, "'"));
  }
  if (f.role != "target" && !f.drafter_address.empty()) {
    return InvalidArgumentError("--drafter-address is for --role target");
  }
  if ((f.role == "target" || f.role == "drafter") && !f.spec.step_trace.empty()) {
    return InvalidArgumentError(
        "--step-trace is for --role router or all (the draft budget plans on the router)");
  }
  if (f.role != "drafter" && f.proposal_top_k != drafter::kDefaultProposalTopK) {
    return InvalidArgumentError(
        "--proposal-top-k is for --role drafter (in-process drafters keep proposals dense)");
  }
  if (f.proposal_top_k < 0 || f.proposal_top_k > std::numeric_limits<int32_t>::max()) {
    return InvalidArgumentError(
        StrCat("--proposal-top-k must be >= 0 (0 = dense), got ", f.proposal_top_k));
  }
  if (f.drafter_deadline_ms < 1) {
    return InvalidArgumentError(
        StrCat("--drafter-deadline-ms must be at least 1, got ", f.drafter_deadline_ms));
  }
  if (!(f.target_step_deadline_s >= 0.001)) {
    return InvalidArgumentError(
        StrCat("--target-step-deadline-s must be at least 0.001, got ", f.target_step_deadline_s));
  }
  if (f.max_prompt_bytes < 1) {
    return InvalidArgumentError(
        StrCat("--max-prompt-bytes must be at least 1, got ", f.max_prompt_bytes));
  }
  if (f.max_request_bytes < 1024 || f.max_request_bytes > (int64_t{1} << 31) - 1) {
    return InvalidArgumentError(
        StrCat("--max-request-bytes must be in [1024, 2147483647], got ", f.max_request_bytes));
  }
  if (!(f.log_stats_interval_s >= 0)) {
    return InvalidArgumentError(
        StrCat("--log-stats-interval-s must be >= 0, got ", f.log_stats_interval_s));
  }
  if (f.connect_timeout_s < 0) {
    return InvalidArgumentError(
        StrCat("--connect-timeout-s must be >= 0, got ", f.connect_timeout_s));
  }
  return OkStatus();
}

std::chrono::milliseconds ConnectTimeout(const ServeFlags& f) {
  return std::chrono::milliseconds(static_cast<int64_t>(f.connect_timeout_s * 1000));
}

int g_signal_pipe[2] = {-1, -1};

extern "C" void OnShutdownSignal(int signal) {
  const unsigned char byte = static_cast<unsigned char>(signal);
  (void)!write(g_signal_pipe[1], &byte, 1);  // async-signal-safe
}

Status InstallShutdownSignals() {
  if (pipe2(g_signal_pipe, O_CLOEXEC) != 0) {
    return InternalError(StrCat("pipe: ", std::strerror(errno)));
  }
  struct sigaction action {};
  action.sa_handler = OnShutdownSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal : {SIGINT, SIGTERM}) {
    if (sigaction(signal, &action, nullptr) != 0) {
      return InternalError(StrCat("sigaction: ", std::strerror(errno)));
    }
  }
  return OkStatus();
}

// Blocks until SIGINT or SIGTERM; returns which.
int WaitForShutdownSignal() {
  unsigned char byte = 0;
  while (read(g_signal_pipe[0], &byte, 1) != 1) {
  }
  return byte;
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ",") + s;
  return out.empty() ? "none" : out;
}

std::string ModelName(const std::string& dir) {
  std::string name = dir;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  return std::filesystem::path(name).filename().string();
}

// The target model with its drafters: --drafter's in this process and, with --drafter-address,
// every other one the drafter service offers. n-gram lookup (serve's default --drafter) stays
// here: it reads only the sequence's own tokens, and a round trip to the service (0.2-0.5 ms per
// drafted step at concurrency 4 on a 2-core CPU, against 0.7 ms for the step) costs more than the
// lookup; `--drafter none` sends every drafter to the service. `where`, if given, says which
// drafters run where (for the listening line).
// `step_thread`: steps run on a thread of the backend's own (--role all with --overlap-steps).
StatusOr<std::unique_ptr<LocalTargetBackend>> LoadTarget(const ServeFlags& f,
                                                         std::string* where = nullptr,
                                                         bool step_thread = false) {
  ASSIGN_OR_RETURN(SpecEngineOptions engine_options, f.spec.EngineOptions(f.max_batch_size));
  ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> target, f.model.Load());
  auto backend =
      std::make_unique<LocalTargetBackend>(std::move(target), engine_options, step_thread);
  RETURN_IF_ERROR(f.spec.AddDrafters(backend->engine(), f.model));
  const std::vector<std::string> local = backend->engine().drafter_names();
  std::vector<std::string> remote;
  auto describe = [&] {
    if (!where) return;
    *where = StrCat("drafters ", local.empty() ? "none" : Join(local), " (local)");
    if (!f.drafter_address.empty()) {
      *where += StrCat(", ", remote.empty() ? "none" : Join(remote), " at ", f.drafter_address);
    }
  };
  if (f.drafter_address.empty()) {
    describe();
    return backend;
  }
  const ModelConfig& config = backend->target().config();
  ASSIGN_OR_RETURN(
      std::shared_ptr<target::DrafterConnection> connection,
      target::DrafterConnection::Connect(f.drafter_address, ConnectTimeout(f),
                                         static_cast<int32_t>(config.vocab_size),
                                         static_cast<int32_t>(config.hidden_size),
                                         backend->target().dtype_name(), f.security.peer_channel));
  connection->set_call_deadline(std::chrono::milliseconds(f.drafter_deadline_ms));
  for (const v1::DrafterSpec& spec : connection->info().drafters()) {
    if (std::find(local.begin(), local.end(), spec.name()) != local.end()) {
      LogInfo(StrCat("specula serve: drafter '", spec.name(), "' runs in the target process; the ",
                     "drafter service's is not used (--drafter none: all at the service)"));
      continue;
    }
    RETURN_IF_ERROR(
        backend->engine().AddDrafter(std::make_unique<target::RemoteDrafter>(connection, spec)));
    remote.push_back(spec.name());
  }
  describe();
  return backend;
}

// Serves until SIGINT/SIGTERM, then shuts down with `stop`.
void ServeUntilSignal(const std::function<void()>& stop) {
  const int signal = WaitForShutdownSignal();
  LogInfo(StrCat("specula serve: ", signal == SIGINT ? "SIGINT" : "SIGTERM", ", shutting down"));
  stop();
  LogInfo("specula serve: stopped");
}

Status RunInternalService(ServeFlags& f) {
  std::unique_ptr<LocalTargetBackend> target;
  std::unique_ptr<grpc::Service> service;
  std::unique_ptr<target::TargetMetrics> target_metrics;
  std::unique_ptr<drafter::DrafterMetrics> drafter_metrics;
  services::MetricsRegistry* registry = nullptr;
  std::string service_name;
  std::string what;
  if (f.role == "target") {
    ASSIGN_OR_RETURN(target, LoadTarget(f, &what));
    target_metrics = std::make_unique<target::TargetMetrics>();
    registry = &target_metrics->registry();
    service = std::make_unique<target::TargetService>(target.get(), target_metrics.get());
    service_name = v1::Target::service_full_name();
  } else {
    ASSIGN_OR_RETURN(
        ModelConfig config,
        ModelConfig::FromFile((std::filesystem::path(f.model.model) / "config.json").string()));
    ASSIGN_OR_RETURN(std::vector<std::unique_ptr<Drafter>> drafters,
                     f.spec.LoadDrafters(config, f.model));
    std::vector<std::string> names;
    for (const auto& d : drafters) names.push_back(d->name());
    if (names.empty()) return InvalidArgumentError("--role drafter needs --drafter with a drafter");
    drafter_metrics = std::make_unique<drafter::DrafterMetrics>();
    registry = &drafter_metrics->registry();
    service = std::make_unique<drafter::DrafterService>(
        std::move(drafters),
        drafter::DrafterServiceOptions{.vocab_size = static_cast<int32_t>(config.vocab_size),
                                       .hidden_size = static_cast<int32_t>(config.hidden_size),
                                       .dtype = f.model.dtype,
                                       .context_length = config.max_position_embeddings,
                                       .proposal_top_k = static_cast<int32_t>(f.proposal_top_k)},
        drafter_metrics.get());
    service_name = v1::Drafter::service_full_name();
    what = StrCat("drafters ", Join(names));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<services::ServiceServer> server,
                   services::ServiceServer::Start(f.host, static_cast<int>(f.port), service.get(),
                                                  service_name, f.security.peer_server));
  std::string metrics = "metrics off";
  if (f.metrics_port != 0) {
    ASSIGN_OR_RETURN(
        int port,
        registry->Expose(f.host, f.metrics_port < 0 ? 0 : static_cast<int>(f.metrics_port)));
    metrics = StrCat("metrics on http://", f.host, ":", port, "/metrics");
  }
  std::printf("specula serve: listening on %s:%d (role %s, model %s, %s, %s)\n", f.host.c_str(),
              server->port(), f.role.c_str(), f.model.model.c_str(), what.c_str(), metrics.c_str());
  std::fflush(stdout);
  ServeUntilSignal([&] {
    server->Shutdown(std::chrono::milliseconds(static_cast<int64_t>(f.shutdown_grace_s * 1000)));
  });
  return OkStatus();
}

Status Run(ServeFlags& f) {
  ASSIGN_OR_RETURN(const LogLevel log_level, ParseLogLevel(f.log_level));
  SetLogLevel(log_level);
  RETURN_IF_ERROR(CheckRole(f));
  RETURN_IF_ERROR(f.security.Load(f.role));
  if (f.port < 0 || f.port > 65535) {
    return InvalidArgumentError(StrCat("--port must be in [0, 65535], got ", f.port));
  }
  if (f.metrics_port < -1 || f.metrics_port > 65535) {
    return InvalidArgumentError(
        StrCat("--metrics-port must be in [-1, 65535], got ", f.metrics_port));
  }
  if (!f.spec.verify.empty()) {
    return InvalidArgumentError(
        "--verify: requests choose their verification rule (GenerateRequest.speculation.verify); "
        "--beta, --tau, --typical-epsilon and --typical-delta set the lossy rules' defaults");
  }
  if (f.max_batch_size < 1) {
    return InvalidArgumentError(
        StrCat("--max-batch-size must be at least 1, got ", f.max_batch_size));
  }
  if (f.max_queue < 1) {
    return InvalidArgumentError(StrCat("--max-queue must be at least 1, got ", f.max_queue));
  }
  if (f.draft_len < 0 || f.draft_len > kMaxDraftTokens) {
    // Checked here, not per request: a default past the engine's cap would refuse every request.
    return InvalidArgumentError(
        StrCat("--draft-len must be in [0, ", kMaxDraftTokens, "], got ", f.draft_len));
  }
  if (f.model.model.empty()) return InvalidArgumentError("--model is required");

  // SIGINT/SIGTERM may land on any thread (libraries start threads of their own at load time), so
  // the handler only writes the signal number to a pipe; this thread reads it and shuts down.
  RETURN_IF_ERROR(InstallShutdownSignals());
  if (f.role == "target" || f.role == "drafter") return RunInternalService(f);

  // auto: a remote target steps in its own process, so the router's delivery costs it nothing;
  // an in-process target on the CPU already has the cores busy with its kernels (delivering
  // beside them measured 4-6% fewer tokens/s at concurrency 16 on 2 vCPUs), on a GPU it does not.
  const bool overlap =
      f.overlap_steps == "true" ||
      (f.overlap_steps == "auto" && (f.role == "router" || f.model.device != "cpu"));

  router::ServedModel served;
  served.path = f.model.model;
  served.name = ModelName(f.model.model);
  const std::string tok_path = (std::filesystem::path(f.model.model) / "tokenizer.json").string();
  ASSIGN_OR_RETURN(served.tokenizer, Tokenizer::FromFile(tok_path));
  if (f.role == "router") {
    ASSIGN_OR_RETURN(
        served.backend,
        router::RemoteTargetBackend::Connect(
            f.target_address, ConnectTimeout(f),
            std::chrono::milliseconds(static_cast<int64_t>(f.target_step_deadline_s * 1000)),
            f.security.peer_channel));
  } else {
    ASSIGN_OR_RETURN(served.backend, LoadTarget(f, nullptr, overlap));
  }
  const std::vector<std::string> drafters = served.backend->info().drafters;

  router::RouterServerOptions options;
  options.host = f.host;
  options.port = static_cast<int>(f.port);
  if (f.metrics_port != 0)
    options.metrics_port = f.metrics_port < 0 ? 0 : static_cast<int>(f.metrics_port);
  options.max_prompt_bytes = f.max_prompt_bytes;
  options.max_request_bytes = f.max_request_bytes;
  options.credentials = f.security.public_server;
  options.api_token = f.security.api_token;
  options.log_stats_interval_s = f.log_stats_interval_s;
  options.loop.max_queue = static_cast<int32_t>(f.max_queue);
  options.loop.overlap_steps = overlap;
  options.loop.max_batch_size = static_cast<int32_t>(f.max_batch_size);
  // Default drafter: the flag, else the first drafter listed in --drafter (all) or the first the
  // target offers (router).
  if (!f.default_drafter.empty()) {
    options.loop.default_drafter = f.default_drafter;
  } else if (f.role == "router") {
    options.loop.default_drafter = drafters.empty() ? "none" : drafters.front();
  } else {
    ASSIGN_OR_RETURN(std::vector<std::string> listed, f.spec.DrafterNames());
    options.loop.default_drafter = listed.front();
  }
  if (options.loop.default_drafter != "none" &&
      std::find(drafters.begin(), drafters.end(), options.loop.default_drafter) == drafters.end()) {
    return InvalidArgumentError(StrCat("--default-drafter: '", options.loop.default_drafter,
                                       "' is not loaded (drafters: ", Join(drafters), ")"));
  }
  if (f.spec.draft_budget != "fixed" && f.spec.draft_budget != "adaptive") {
    return InvalidArgumentError(
        StrCat("--draft-budget must be fixed or adaptive, got '", f.spec.draft_budget, "'"));
  }
  const bool adaptive = f.spec.draft_budget == "adaptive";
  if (adaptive && (f.spec.draft_cap < 1 || f.spec.draft_cap > kMaxDraftTokens)) {
    return InvalidArgumentError(
        StrCat("--draft-cap must be in [1, ", kMaxDraftTokens, "], got ", f.spec.draft_cap));
  }
  options.loop.adaptive_draft_budget = adaptive;
  if (adaptive) {
    ASSIGN_OR_RETURN(options.loop.draft_budget, f.spec.BudgetOptions());
  }
  if (adaptive && !f.spec.cost_profile.empty()) {
    ASSIGN_OR_RETURN(options.loop.cost_profile, LoadCostProfile(f.spec.cost_profile));
  }
  ASSIGN_OR_RETURN(options.loop.step_trace,
                   f.spec.OpenStepTrace(adaptive, "--draft-budget adaptive"));
  // The adaptive budget's cap is what requests without their own are reserved KV room for.
  const int64_t default_draft = adaptive ? f.spec.draft_cap : f.draft_len;
  options.loop.default_max_draft_tokens = static_cast<int32_t>(default_draft);
  options.loop.verify_defaults.specdec_beta = static_cast<int32_t>(f.spec.beta);
  options.loop.verify_defaults.specdec_tau = static_cast<float>(f.spec.tau);
  options.loop.verify_defaults.typical_epsilon = static_cast<float>(f.spec.typical_epsilon);
  options.loop.verify_defaults.typical_delta = static_cast<float>(f.spec.typical_delta);
  const std::string default_drafter = options.loop.default_drafter;
  ASSIGN_OR_RETURN(std::unique_ptr<router::RouterServer> server,
                   router::RouterServer::Start(std::move(served), options));

  std::string metrics = "metrics off";
  if (server->metrics_port() > 0) {
    metrics = StrCat("metrics on http://", f.host, ":", server->metrics_port(), "/metrics");
  }
  const std::string target = f.role == "router" ? "target at " + f.target_address : "in process";
  std::printf(
      "specula serve: listening on %s:%d (role %s, model %s, %s, drafters %s, default drafter %s "
      "%s%lld, %s)\n",
      f.host.c_str(), server->port(), f.role.c_str(), f.model.model.c_str(), target.c_str(),
      Join(drafters).c_str(), default_drafter.c_str(), adaptive ? "adaptive up to " : "x",
      static_cast<long long>(default_draft), metrics.c_str());
  std::fflush(stdout);

  ServeUntilSignal([&] {
    server->Shutdown(std::chrono::milliseconds(static_cast<int64_t>(f.shutdown_grace_s * 1000)));
    server.reset();
  });
  return OkStatus();
}

}  // namespace

int RunServe(const std::vector<std::string>& args) {
  ServeFlags f;
  f.model.model = "models/pyllama-6m";
  f.spec.drafter = "ngram";
  FlagSet flags(kCommand);
  flags.AddString("role", &f.role,
                  "all = router, target and drafters in one process; router = the public API, "
                  "steps on --target-address; target = the verifier, drafters on "
                  "--drafter-address (or local); drafter = the drafter models");
  flags.AddString("target-address", &f.target_address, "router: the target service, HOST:PORT");
  flags.AddString("drafter-address", &f.drafter_address,
                  "target: the drafter service, HOST:PORT; its drafters are added to --drafter's, "
                  "which run in the target process (default ngram: a lookup costs less than the "
                  "round trip; none = every drafter at the service)");
  flags.AddDouble("connect-timeout-s", &f.connect_timeout_s,
                  "router/target: how long to wait at startup for the target/drafter service");
  flags.AddInt("drafter-deadline-ms", &f.drafter_deadline_ms,
               "target: deadline of each call to the drafter service; a late drafter costs only "
               "that step's speculation (counted in draft_errors)");
  flags.AddInt("proposal-top-k", &f.proposal_top_k,
               "drafter: sampled candidates are drawn from their proposal cut to its top k tokens "
               "and sent with that sparse proposal (lossless; ~6 bytes per kept token instead of 4 "
               "per vocabulary entry); 0 = dense");
  flags.AddDouble("target-step-deadline-s", &f.target_step_deadline_s,
                  "router: deadline of each engine step on the target; a hung target fails its "
                  "requests with DEADLINE_EXCEEDED");
  flags.AddInt("max-prompt-bytes", &f.max_prompt_bytes,
               "router/all: largest prompt text in bytes, refused with INVALID_ARGUMENT before "
               "tokenization");
  flags.AddInt("max-request-bytes", &f.max_request_bytes,
               "router/all: largest gRPC request message the public API accepts "
               "(RESOURCE_EXHAUSTED beyond)");
  flags.AddString(
      "host", &f.host,
      "address to listen on (127.0.0.1 = this machine only; 0.0.0.0 = every interface)");
  flags.AddInt("port", &f.port, "gRPC port (0 = any free port, printed at startup)");
  flags.AddInt("metrics-port", &f.metrics_port,
               "Prometheus /metrics port on --host (0 = off, -1 = any free port)");
  f.model.Register(flags);
  f.spec.Register(flags, /*many_drafters=*/true);
  // The bundled draft LM, so `specula serve --drafter draft-model` works as it is.
  if (Status s = flags.SetDefault("drafter-model", "models/pyllama-draft-1m"); !s.ok()) {
    return ReportError(kCommand, s);
  }
  // Served, the streams' p99 inter-token gap is bounded by default (spec_flags.h).
  if (Status s = flags.SetDefault("max-draft-slowdown", StrCat(kServeMaxDraftSlowdown)); !s.ok()) {
    return ReportError(kCommand, s);
  }
  // Same flag and target as SpecFlags', with serve's meaning in --help (FlagSet keeps the last).
  flags.AddString("drafter", &f.spec.drafter,
                  StrCat("comma-separated drafters to load (requests pick one, or none): ",
                         f.spec.drafters->Describe()));
  flags.AddString("default-drafter", &f.default_drafter,
                  "drafter for requests that name none: one of --drafter or none (default: the "
                  "first of --drafter)");
  f.spec.draft_budget = "adaptive";
  flags.AddString("draft-budget", &f.spec.draft_budget,
                  "adaptive: each step's draft nodes per request chosen from measured step costs "
                  "and acceptance (0 = no draft when it cannot pay), up to the request's "
                  "max_draft_tokens or --draft-cap | fixed: --draft-len nodes every step");
  flags.AddInt("draft-len", &f.draft_len,
               StrCat("--draft-budget fixed: draft tokens per step for requests that give "
                      "max_draft_tokens 0 (at most ",
                      kMaxDraftTokens, ")"));
  flags.AddInt("max-batch-size", &f.max_batch_size, "sequences decoded together per engine step");
  flags.AddString("overlap-steps", &f.overlap_steps,
                  "true: deliver each step's tokens to the clients (detokenize, stop strings, "
                  "stream) while the next step runs, on the target service (router) or on a "
                  "thread of its own (all) | false: deliver, then start the next step | auto: "
                  "true for the router and for an in-process target on a GPU, false on the CPU, "
                  "whose cores the target's kernels already use");
  flags.AddInt("max-queue", &f.max_queue,
               "requests waiting or running at once; more get RESOURCE_EXHAUSTED");
  flags.AddDouble("shutdown-grace-s", &f.shutdown_grace_s,
                  "on SIGINT/SIGTERM, seconds running calls may take to finish");
  f.security.Register(flags);
  flags.AddString("log-level", &f.log_level,
                  "stderr log lines at or above: debug, info (access log + stats), warning, "
                  "error or off");
  flags.AddDouble("log-stats-interval-s", &f.log_stats_interval_s,
                  "router/all: a stats line (throughput, running/waiting, KV cache, acceptance) "
                  "every this many seconds, at debug level while idle (0 = off)");
  for (const auto& [title, names] : kHelpSections) {
    for (const char* name : names) flags.MoveToSection(name, title);
  }
  return RunCommand(flags, args, [&] { return Run(f); });
}

}  // namespace specula::cli
