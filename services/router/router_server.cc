#include "services/router/router_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <thread>

namespace specula::router {

StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(ServedModel model,
                                                            RouterServerOptions options) {
  std::unique_ptr<RouterServer> s(new RouterServer);
  s->metrics_ = std::make_unique<RouterMetrics>(RouterMetricsOptions{
      .model_name = model.name,
      .max_model_len = model.backend ? model.backend->info().context_length : 0});
  if (options.metrics_port) {
    ASSIGN_OR_RETURN(s->metrics_port_, s->metrics_->Expose(options.host, *options.metrics_port));
  }
  ASSIGN_OR_RETURN(s->loop_, EngineLoop::Create(std::move(model), options.loop, s->metrics_.get()));
  s->service_ = std::make_unique<GenerationService>(
      s->loop_.get(), s->metrics_.get(), options.max_prompt_bytes, ApiTokenAuth(options.api_token));

  // Both are process-wide switches that take effect for servers built afterwards.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = StrCat(options.host, ":", options.port);
  const bool tls = options.credentials != nullptr;
  builder.AddListeningPort(address, tls ? options.credentials : grpc::InsecureServerCredentials(),
                           &s->port_);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_request_bytes));
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return UnavailableError(StrCat("cannot listen on ", address,
                                   tls ? " (or the TLS key does not match its certificate)" : ""));
  }
  s->server_->GetHealthCheckService()->SetServingStatus(v1::Generation::service_full_name(), true);
  if (options.log_stats_interval_s > 0) {
    s->stats_logger_ = std::make_unique<StatsLogger>(
        s->metrics_.get(),
        std::chrono::milliseconds(static_cast<int64_t>(options.log_stats_interval_s * 1000)));
  }
  return s;
}

RouterServer::~RouterServer() { Shutdown(); }

void RouterServer::Shutdown(std::chrono::milliseconds grace) {
  if (shut_down_) return;
  shut_down_ = true;
  stats_logger_.reset();
  if (server_) server_->GetHealthCheckService()->Shutdown();
  if (loop_) {
    // Drain here rather than through grpc::Server::Shutdown's deadline: gRPC waits for the whole
    // deadline while any client keeps an idle connection open.
    loop_->StopAccepting();
    const auto end = std::chrono::steady_clock::now() + grace;
    // Until every accepted request has finished in the engine and its handler has written it.
    auto busy = [&] {
      return loop_->load().in_flight > 0 || (service_ && service_->calls_in_progress() > 0);
    };
    while (busy() && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  if (server_) {
    // Handlers of finished requests only have their last message to write.
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    server_->Wait();
  }
  if (loop_) loop_->Shutdown();
}

}  // namespace specula::router
