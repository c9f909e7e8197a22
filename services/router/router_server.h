// The all-in-one router process: the Generation service plus gRPC health checking
// (grpc.health.v1) and server reflection on one gRPC server, and the Prometheus endpoint.
#pragma once

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "common/util/status.h"
#include "services/router/engine_loop.h"
#include "services/router/generation_service.h"
#include "services/router/metrics.h"
#include "services/router/server_log.h"

namespace specula::router {

inline constexpr int64_t kDefaultMaxRequestBytes = int64_t{4} << 20;

struct RouterServerOptions {
  std::string host = "127.0.0.1";
  int port = 50051;  // 0 = any free port (see RouterServer::port())
  // Prometheus /metrics on host:metrics_port; nullopt = off, 0 = any free port.
  std::optional<int> metrics_port;
  EngineLoopOptions loop;
  // Prompt texts over this many bytes are refused (INVALID_ARGUMENT) before tokenization.
  int64_t max_prompt_bytes = kDefaultMaxPromptBytes;
  // gRPC messages over this many bytes are refused by gRPC (RESOURCE_EXHAUSTED).
  int64_t max_request_bytes = kDefaultMaxRequestBytes;
  // The public port's credentials (services/common/tls.h); null = insecure.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Bearer token every Generation call must carry (api_token.h); empty = none.
  std::string api_token;
  // A stats line (server_log.h) every this many seconds; 0 = none. (`specula serve`: 10.)
  double log_stats_interval_s = 0;
};

class RouterServer {
 public:
  // Starts the engine loop, the metrics endpoint and the gRPC server. UNAVAILABLE if a port cannot
  // be bound; the loop's errors as EngineLoop::Create.
  static StatusOr<std::unique_ptr<RouterServer>> Start(ServedModel model,
                                                       RouterServerOptions options);
  ~RouterServer();  // Shutdown()

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }  // 0 when off
  EngineLoop& loop() { return *loop_; }
  RouterMetrics& metrics() { return *metrics_; }

  // Reports NOT_SERVING and refuses new requests (UNAVAILABLE), lets the requests already accepted
  // finish for up to `grace`, then stops the gRPC server (cancelling what is left) and the engine
  // loop. Idempotent.
  void Shutdown(std::chrono::milliseconds grace = std::chrono::seconds(5));

 private:
  RouterServer() = default;

  std::unique_ptr<RouterMetrics> metrics_;
  std::unique_ptr<StatsLogger> stats_logger_;
  std::unique_ptr<EngineLoop> loop_;
  std::unique_ptr<GenerationService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  int metrics_port_ = 0;
  bool shut_down_ = false;
};

}  // namespace specula::router
