#include "services/router/generation_service.h"

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/method_handler.h>

#include <string>
#include <vector>

#include "services/router/generate_stream_reactor.h"
#include "services/router/request_convert.h"

namespace specula::router {
namespace {

// The call's deadline on the steady clock (gRPC reports it on the system clock).
Clock::time_point SteadyDeadline(const grpc::ServerContextBase& context) {
  const auto deadline = context.deadline();
  const auto now = std::chrono::system_clock::now();
  if (deadline >= now + std::chrono::hours(24 * 365)) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(deadline - now);
}

}  // namespace

GenerationService::GenerationService(EngineLoop* loop, RouterMetrics* metrics,
                                     int64_t max_prompt_bytes, ApiTokenAuth auth)
    : loop_(loop), metrics_(metrics), max_prompt_bytes_(max_prompt_bytes), auth_(std::move(auth)) {
  // Method indices as in generation.proto's service (the generated WithStreamed*Method_ classes
  // use the same ones).
  MarkMethodStreamed(0,
                     new grpc::internal::StreamedUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
                         [this](grpc::ServerContext* context, RawUnary* stream) {
                           return RawGenerate(context, stream);
                         }));
  MarkMethodRawCallback(
      1, new grpc::internal::CallbackServerStreamingHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
             [this](grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
               return GenerateStreamCall(context, request);
             }));
}

grpc::Status GenerationService::ParseRequest(const grpc::ByteBuffer& buffer,
                                             v1::GenerateRequest* request) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "request bytes");
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  if (request->ParseFromString(bytes)) return grpc::Status::OK;
  const Status why = DiagnoseUnparsable(v1::GenerateRequest::descriptor(), bytes);
  if (metrics_) metrics_->Rejected(why.code());
  return ToGrpcStatus(why);
}

grpc::Status GenerationService::RawGenerate(grpc::ServerContext* context, RawUnary* stream) {
  if (grpc::Status auth = auth_.Check(*context); !auth.ok()) return auth;
  v1::GenerateRequest request;
  grpc::ByteBuffer buffer;
  if (!stream->Read(&buffer)) return grpc::Status(grpc::StatusCode::CANCELLED, "no request");
  grpc::Status parsed = ParseRequest(buffer, &request);
  if (!parsed.ok()) return parsed;
  v1::GenerateResponse response;
  grpc::Status status = Generate(context, &request, &response);
  if (!status.ok()) return status;
  grpc::ByteBuffer out;
  bool own_buffer = false;
  grpc::Status serialized =
      grpc::SerializationTraits<v1::GenerateResponse>::Serialize(response, &out, &own_buffer);
  if (!serialized.ok()) return serialized;
  stream->Write(out);
  return grpc::Status::OK;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::GenerateStreamCall(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* bytes) {
  if (grpc::Status auth = auth_.Check(*context); !auth.ok()) {
    return GenerateStreamReactor::Refuse(auth);
  }
  v1::GenerateRequest request;
  if (grpc::Status parsed = ParseRequest(*bytes, &request); !parsed.ok()) {
    return GenerateStreamReactor::Refuse(parsed);
  }
  auto resolved = Resolve(*context, request);
  if (!resolved.ok()) return GenerateStreamReactor::Refuse(ToGrpcStatus(resolved.status()));
  ++calls_in_progress_;
  return GenerateStreamReactor::Start(
      loop_, std::move(resolved->request), std::move(resolved->request_id), resolved->speculation,
      [this](const Status& refused) {
        if (metrics_) metrics_->Rejected(refused.code());
      },
      [this] { --calls_in_progress_; });
}

StatusOr<GenerationService::Resolved> GenerationService::Resolve(
    const grpc::ServerContextBase& context, const v1::GenerateRequest& request) {
  Resolved out;
  out.request_id = request.request_id().empty() ? StrCat("req-", next_request_id_.fetch_add(1))
                                                : request.request_id();
  auto loop_request = ToLoopRequest(request, loop_->info(), loop_->tokenizer(), max_prompt_bytes_);
  if (!loop_request.ok()) {
    if (metrics_) metrics_->Rejected(loop_request.status().code());
    return loop_request.status();
  }
  out.request = std::move(*loop_request);
  out.request.deadline = SteadyDeadline(context);
  out.request.id = out.request_id;
  out.speculation = out.request.spec.speculation;
  return out;
}

StatusOr<GenerationService::Started> GenerationService::Start(grpc::ServerContext* context,
                                                              const v1::GenerateRequest& request) {
  ASSIGN_OR_RETURN(Resolved resolved, Resolve(*context, request));
  Started started;
  started.request_id = std::move(resolved.request_id);
  started.speculation = resolved.speculation;
  auto channel = loop_->Submit(std::move(resolved.request));
  if (!channel.ok()) {
    if (metrics_) metrics_->Rejected(channel.status().code());
    return channel.status();
  }
  started.channel = std::move(*channel);
  return started;
}

grpc::Status GenerationService::Drain(grpc::ServerContext* context, RequestChannel& channel,
                                      const std::function<bool(const LoopEvent&)>& on_event) {
  ++calls_in_progress_;
  struct Done {
    std::atomic<int64_t>& count;
    ~Done() { --count; }
  } done{calls_in_progress_};
  while (true) {
    for (const LoopEvent& event : channel.Wait(kPollInterval)) {
      if (!on_event(event)) {
        loop_->Cancel(channel);
        return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
      }
      if (event.finished) return ToGrpcStatus(event.status);
    }
    if (context->IsCancelled()) {
      loop_->Cancel(channel);
      return grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled");
    }
  }
}

grpc::Status GenerationService::Generate(grpc::ServerContext* context,
                                         const v1::GenerateRequest* request,
                                         v1::GenerateResponse* response) {
  auto started = Start(context, *request);
  if (!started.ok()) return ToGrpcStatus(started.status());
  response->set_request_id(started->request_id);
  std::string* text = response->mutable_text();
  return Drain(context, *started->channel, [&](const LoopEvent& event) {
    text->append(event.text);
    for (int32_t id : event.token_ids) response->add_token_ids(id);
    if (event.finished) {
      response->set_finish_reason(ToProto(event.finish_reason));
      response->set_stop_string(event.stop_string);
      response->mutable_usage()->set_prompt_tokens(static_cast<int32_t>(event.prompt_tokens));
      response->mutable_usage()->set_completion_tokens(
          static_cast<int32_t>(event.completion_tokens));
      FillSpecStats(started->speculation, event.stats, response->mutable_spec());
    }
    return true;
  });
}

grpc::Status GenerationService::GetServerInfo(grpc::ServerContext* context,
                                              const v1::GetServerInfoRequest* request,
                                              v1::ServerInfo* response) {
  if (grpc::Status auth = auth_.Check(*context); !auth.ok()) return auth;
  FillServerInfo(loop_->info(), loop_->load(), response);
  return grpc::Status::OK;
}

}  // namespace specula::router
