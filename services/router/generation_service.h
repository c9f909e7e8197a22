// The Generation gRPC service (proto/specula/v1/generation.proto) on the synchronous gRPC API:
// each handler validates its request, submits it to the EngineLoop and blocks on the request's
// channel, waking at least every kPollInterval to notice a client that cancelled or whose deadline
// passed (the request is then cancelled in the engine, which frees its KV blocks).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "services/router/engine_loop.h"
#include "services/router/metrics.h"
#include "specula/v1/generation.grpc.pb.h"

namespace specula::router {

class GenerationService final : public v1::Generation::Service {
 public:
  static constexpr std::chrono::milliseconds kPollInterval{20};

  // `loop` and `metrics` (may be null) must outlive the service.
  GenerationService(EngineLoop* loop, RouterMetrics* metrics);

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        v1::GenerateResponse* response) override;
  grpc::Status GenerateStream(grpc::ServerContext* context, const v1::GenerateRequest* request,
                              grpc::ServerWriter<v1::GenerateStreamResponse>* writer) override;
  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest* request,
                             v1::ServerInfo* response) override;

 private:
  struct Started {
    std::string request_id;
    SpeculationSettings speculation;
    std::shared_ptr<RequestChannel> channel;
  };
  // Validates and submits the request with the call's deadline.
  StatusOr<Started> Start(grpc::ServerContext* context, const v1::GenerateRequest& request);
  // Passes each event to `on_event` until the last one; returns the request's final status.
  // `on_event` returns false when the client is gone (the request is then cancelled).
  grpc::Status Drain(grpc::ServerContext* context, RequestChannel& channel,
                     const std::function<bool(const LoopEvent&)>& on_event);

  EngineLoop* loop_;
  RouterMetrics* metrics_;
  std::atomic<int64_t> next_request_id_{1};
};

}  // namespace specula::router
