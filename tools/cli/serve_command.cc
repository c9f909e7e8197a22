// specula serve: the gRPC server. `--role all` (the default and, for now, the only role) runs the
// router, the target and the drafters in one process: the public Generation API over an
// in-process engine loop, with health checking, reflection and Prometheus metrics.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "common/spec/spec_engine.h"
#include "common/tokenizer/tokenizer.h"
#include "services/router/router_server.h"
#include "tools/cli/commands.h"
#include "tools/cli/model_flags.h"
#include "tools/cli/spec_flags.h"

namespace specula::cli {
namespace {

constexpr char kCommand[] = "serve";

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
};

Status CheckRole(const std::string& role) {
  if (role == "all") return OkStatus();
  if (role == "router" || role == "target" || role == "drafter") {
    return UnimplementedError(StrCat("--role ", role,
                                     " is not yet available: the router/target/drafter split is "
                                     "planned; use --role all (every role in one process)"));
  }
  return InvalidArgumentError(
      StrCat("--role must be all, router, target or drafter, got '", role, "'"));
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

Status Run(ServeFlags& f) {
  RETURN_IF_ERROR(CheckRole(f.role));
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
  if (f.draft_len < 0)
    return InvalidArgumentError(StrCat("--draft-len must be >= 0, got ", f.draft_len));

  // SIGINT/SIGTERM may land on any thread (libraries start threads of their own at load time), so
  // the handler only writes the signal number to a pipe; this thread reads it and shuts down.
  RETURN_IF_ERROR(InstallShutdownSignals());

  if (f.model.model.empty()) return InvalidArgumentError("--model is required");
  router::ServedModel served;
  served.path = f.model.model;
  std::string name = f.model.model;
  while (name.size() > 1 && name.back() == '/') name.pop_back();
  served.name = std::filesystem::path(name).filename().string();
  const std::string tok_path = (std::filesystem::path(f.model.model) / "tokenizer.json").string();
  ASSIGN_OR_RETURN(served.tokenizer, Tokenizer::FromFile(tok_path));
  ASSIGN_OR_RETURN(served.target, f.model.Load());
  served.engine = std::make_unique<SpecEngine>(
      served.target.get(),
      SpecEngineOptions{.max_batch_size = static_cast<int32_t>(f.max_batch_size)});
  RETURN_IF_ERROR(f.spec.AddDrafters(*served.engine, f.model));
  const std::vector<std::string> drafters = served.engine->drafter_names();

  router::RouterServerOptions options;
  options.host = f.host;
  options.port = static_cast<int>(f.port);
  if (f.metrics_port != 0)
    options.metrics_port = f.metrics_port < 0 ? 0 : static_cast<int>(f.metrics_port);
  options.loop.max_queue = static_cast<int32_t>(f.max_queue);
  options.loop.max_batch_size = static_cast<int32_t>(f.max_batch_size);
  // Default drafter: the flag, else the first drafter listed in --drafter.
  ASSIGN_OR_RETURN(std::vector<std::string> listed, f.spec.DrafterNames());
  options.loop.default_drafter = f.default_drafter.empty() ? listed.front() : f.default_drafter;
  if (options.loop.default_drafter != "none" &&
      !served.engine->drafter(options.loop.default_drafter)) {
    return InvalidArgumentError(StrCat("--default-drafter: '", options.loop.default_drafter,
                                       "' is not loaded (--drafter ", f.spec.drafter, ")"));
  }
  options.loop.default_max_draft_tokens = static_cast<int32_t>(f.draft_len);
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
  std::printf(
      "specula serve: listening on %s:%d (model %s, drafters %s, default drafter %s x%lld, %s)\n",
      f.host.c_str(), server->port(), f.model.model.c_str(), Join(drafters).c_str(),
      default_drafter.c_str(), static_cast<long long>(f.draft_len), metrics.c_str());
  std::fflush(stdout);

  const int signal = WaitForShutdownSignal();
  std::fprintf(stderr, "specula serve: %s, shutting down\n",
               signal == SIGINT ? "SIGINT" : "SIGTERM");
  server->Shutdown(std::chrono::milliseconds(static_cast<int64_t>(f.shutdown_grace_s * 1000)));
  server.reset();
  std::fprintf(stderr, "specula serve: stopped\n");
  return OkStatus();
}

}  // namespace

int RunServe(const std::vector<std::string>& args) {
  ServeFlags f;
  f.model.model = "models/pyllama-6m";
  f.spec.drafter = "ngram";
  f.spec.drafter_model = "models/pyllama-draft-1m";
  FlagSet flags(kCommand);
  flags.AddString("role", &f.role,
                  "all = router, target and drafters in one process (router, target and drafter "
                  "alone are not yet available)");
  flags.AddString(
      "host", &f.host,
      "address to listen on (127.0.0.1 = this machine only; 0.0.0.0 = every interface)");
  flags.AddInt("port", &f.port, "gRPC port (0 = any free port, printed at startup)");
  flags.AddInt("metrics-port", &f.metrics_port,
               "Prometheus /metrics port on --host (0 = off, -1 = any free port)");
  f.model.Register(flags);
  f.spec.Register(flags, /*many_drafters=*/true);
  // Same flag and target as SpecFlags', with serve's meaning in --help (FlagSet keeps the last).
  flags.AddString("drafter", &f.spec.drafter,
                  "comma-separated drafters to load: ngram, draft-model (requests pick one, or "
                  "none)");
  flags.AddString("default-drafter", &f.default_drafter,
                  "drafter for requests that name none: one of --drafter or none (default: the "
                  "first of --drafter)");
  flags.AddInt("draft-len", &f.draft_len,
               "draft tokens per step for requests that give max_draft_tokens 0");
  flags.AddInt("max-batch-size", &f.max_batch_size, "sequences decoded together per engine step");
  flags.AddInt("max-queue", &f.max_queue,
               "requests waiting or running at once; more get RESOURCE_EXHAUSTED");
  flags.AddDouble("shutdown-grace-s", &f.shutdown_grace_s,
                  "on SIGINT/SIGTERM, seconds running calls may take to finish");
  return RunCommand(flags, args, [&] { return Run(f); });
}

}  // namespace specula::cli
