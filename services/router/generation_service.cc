#include "services/router/generation_service.h"

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/method_handler.h>

#include <string>
#include <vector>

#include "services/router/request_convert.h"

namespace specula::router {
namespace {

// The call's deadline on the steady clock (gRPC reports it on the system clock).
Clock::time_point SteadyDeadline(const grpc::ServerContext& context) {
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
  MarkMethodStreamed(
      1, new grpc::internal::SplitServerStreamingHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
             [this](grpc::ServerContext* context, RawStream* stream) {
               return RawGenerateStream(context, stream);
             }));
}

template <typename Reader>
grpc::Status GenerationService::ReadRequest(Reader* stream, v1::GenerateRequest* request) {
  grpc::ByteBuffer buffer;
  if (!stream->Read(&buffer)) return grpc::Status(grpc::StatusCode::CANCELLED, "no request");
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
  grpc::Status read = ReadRequest(stream, &request);
  if (!read.ok()) return read;
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

grpc::Status GenerationService::RawGenerateStream(grpc::ServerContext* context, RawStream* stream) {
  if (grpc::Status auth = auth_.Check(*context); !auth.ok()) return auth;
  v1::GenerateRequest request;
  grpc::Status read = ReadRequest(stream, &request);
  if (!read.ok()) return read;
  return StreamEvents(context, request, [&](const v1::GenerateStreamResponse& message) {
    grpc::ByteBuffer out;
    bool own_buffer = false;
    return grpc::SerializationTraits<v1::GenerateStreamResponse>::Serialize(message, &out,
                                                                            &own_buffer)
               .ok() &&
           stream->Write(out);
  });
}

StatusOr<GenerationService::Started> GenerationService::Start(grpc::ServerContext* context,
                                                              const v1::GenerateRequest& request) {
  Started started;
  started.request_id = request.request_id().empty() ? StrCat("req-", next_request_id_.fetch_add(1))
                                                    : request.request_id();
  auto resolved = ToLoopRequest(request, loop_->info(), loop_->tokenizer(), max_prompt_bytes_);
  if (resolved.ok()) {
    resolved->deadline = SteadyDeadline(*context);
    resolved->id = started.request_id;
    started.speculation = resolved->spec.speculation;
    auto channel = loop_->Submit(std::move(*resolved));
    if (channel.ok()) {
      started.channel = std::move(*channel);
      return started;
    }
    resolved = channel.status();
  }
  if (metrics_) metrics_->Rejected(resolved.status().code());
  return resolved.status();
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

grpc::Status GenerationService::GenerateStream(
    grpc::ServerContext* context, const v1::GenerateRequest* request,
    grpc::ServerWriter<v1::GenerateStreamResponse>* writer) {
  return StreamEvents(context, *request, [&](const v1::GenerateStreamResponse& message) {
    return writer->Write(message);
  });
}

grpc::Status GenerationService::StreamEvents(
    grpc::ServerContext* context, const v1::GenerateRequest& request,
    const std::function<bool(const v1::GenerateStreamResponse&)>& write) {
  auto started = Start(context, request);
  if (!started.ok()) return ToGrpcStatus(started.status());
  return Drain(context, *started->channel, [&](const LoopEvent& event) {
    v1::GenerateStreamResponse message;
    message.set_request_id(started->request_id);
    if (!event.token_ids.empty() || !event.text.empty()) {
      v1::TokenDelta* delta = message.mutable_delta();
      for (int32_t id : event.token_ids) delta->add_token_ids(id);
      delta->set_text(event.text);
      if (!write(message)) return false;
    }
    // A request that failed ends with its error status instead of a GenerationFinished.
    if (!event.finished || !event.status.ok()) return true;
    v1::GenerationFinished* finished = message.mutable_finished();
    finished->set_finish_reason(ToProto(event.finish_reason));
    finished->set_stop_string(event.stop_string);
    finished->mutable_usage()->set_prompt_tokens(static_cast<int32_t>(event.prompt_tokens));
    finished->mutable_usage()->set_completion_tokens(static_cast<int32_t>(event.completion_tokens));
    FillSpecStats(started->speculation, event.stats, finished->mutable_spec());
    return write(message);
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
