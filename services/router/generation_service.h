// The Generation gRPC service (proto/specula/v1/generation.proto). GenerateStream runs on gRPC's
// callback API (generate_stream_reactor.h): the engine loop's push of an event has a write
// starter thread start its write, and no thread waits on a stream. Generate (unary) and
// GetServerInfo run on the synchronous API: Generate's handler submits its request to the
// EngineLoop and blocks on the request's channel, waking at least every kPollInterval to notice a
// client that cancelled or whose deadline passed (the request is then cancelled in the engine,
// which frees its KV blocks).
//
// Generate and GenerateStream take their request as raw bytes and parse it here, so that a request
// protobuf cannot parse (a proto3 string that is not UTF-8) gets INVALID_ARGUMENT naming the field
// instead of gRPC's own INTERNAL with an empty message. The optional bearer token (api_token.h) is
// checked first, in each of the three registered handlers.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "services/router/api_token.h"
#include "services/router/engine_loop.h"
#include "services/router/metrics.h"
#include "services/router/request_convert.h"
#include "specula/v1/generation.grpc.pb.h"

namespace specula::router {

class GenerationService final : public v1::Generation::Service {
 public:
  static constexpr std::chrono::milliseconds kPollInterval{20};

  // `loop` and `metrics` (may be null) must outlive the service. Prompt texts longer than
  // `max_prompt_bytes` are refused before tokenization. With `auth` enabled every call must carry
  // the bearer token (UNAUTHENTICATED before its request is read otherwise).
  GenerationService(EngineLoop* loop, RouterMetrics* metrics,
                    int64_t max_prompt_bytes = kDefaultMaxPromptBytes, ApiTokenAuth auth = {});

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        v1::GenerateResponse* response) override;
  grpc::Status GetServerInfo(grpc::ServerContext* context, const v1::GetServerInfoRequest* request,
                             v1::ServerInfo* response) override;

  // Calls whose request was accepted and whose handler has not returned yet. A request can
  // finish in the engine well before its handler has written its last messages (a fast model
  // streams hundreds of tokens per write burst), so a graceful shutdown waits for this too.
  int64_t calls_in_progress() const { return calls_in_progress_.load(); }

 private:
  struct Started {
    std::string request_id;
    SpeculationSettings speculation;
    std::shared_ptr<RequestChannel> channel;
  };
  using RawUnary = grpc::ServerUnaryStreamer<grpc::ByteBuffer, grpc::ByteBuffer>;
  struct Resolved {
    LoopRequest request;
    std::string request_id;
    SpeculationSettings speculation;
  };
  // The registered handlers: parse (or explain why not), then serve.
  grpc::Status RawGenerate(grpc::ServerContext* context, RawUnary* stream);
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerateStreamCall(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request);
  // Parses a request's bytes into `request` (INVALID_ARGUMENT naming the field when it cannot).
  grpc::Status ParseRequest(const grpc::ByteBuffer& buffer, v1::GenerateRequest* request);
  // Validates the request and resolves it for the loop, with the call's deadline.
  StatusOr<Resolved> Resolve(const grpc::ServerContextBase& context,
                             const v1::GenerateRequest& request);
  // Validates and submits the request with the call's deadline.
  StatusOr<Started> Start(grpc::ServerContext* context, const v1::GenerateRequest& request);
  // Passes each event to `on_event` until the last one; returns the request's final status.
  // `on_event` returns false when the client is gone (the request is then cancelled).
  grpc::Status Drain(grpc::ServerContext* context, RequestChannel& channel,
                     const std::function<bool(const LoopEvent&)>& on_event);

  EngineLoop* loop_;
  RouterMetrics* metrics_;
  int64_t max_prompt_bytes_;
  ApiTokenAuth auth_;
  std::atomic<int64_t> next_request_id_{1};
  std::atomic<int64_t> calls_in_progress_{0};
};

}  // namespace specula::router
