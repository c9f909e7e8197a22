#include "services/router/generate_stream_reactor.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <utility>
#include <vector>

#include "services/router/request_convert.h"
#include "specula/v1/generation.pb.h"

namespace specula::router {

// What the reactor and the loop's listener share; every field under `mu`.
struct GenerateStreamReactor::Shared {
  std::mutex mu;
  GenerateStreamReactor* reactor = nullptr;  // null once the call is done
  EngineLoop* loop = nullptr;
  std::shared_ptr<RequestChannel> channel;  // null until the request is submitted
  std::string request_id;
  SpeculationSettings speculation;
  std::deque<grpc::ByteBuffer> pending;  // serialized messages not yet written
  grpc::ByteBuffer writing;              // the message of the write in flight
  bool write_in_flight = false;
  bool cancelled = false;                    // the client is gone
  bool finished = false;                     // Finish called
  std::optional<grpc::Status> final_status;  // the request's last event is taken

  // Starts the next write, or finishes the call, if neither is under way.
  void Pump();
  // Turns the channel's queued events into messages: tokens and text merged into one delta,
  // then the last event's GenerationFinished (or its error status).
  void TakeEvents();
  void Append(const v1::GenerateStreamResponse& message);
};

void GenerateStreamReactor::Shared::Append(const v1::GenerateStreamResponse& message) {
  grpc::ByteBuffer buffer;
  bool own_buffer = false;
  if (!grpc::SerializationTraits<v1::GenerateStreamResponse>::Serialize(message, &buffer,
                                                                        &own_buffer)
           .ok()) {
    final_status = grpc::Status(grpc::StatusCode::INTERNAL, "cannot serialize a stream message");
    return;
  }
  pending.push_back(std::move(buffer));
}

void GenerateStreamReactor::Shared::TakeEvents() {
  v1::GenerateStreamResponse delta;
  bool has_delta = false;
  auto flush = [&] {
    if (has_delta) Append(delta);
    delta.Clear();
    has_delta = false;
  };
  for (LoopEvent& event : channel->TakeAll()) {
    if (final_status) break;
    if (!event.token_ids.empty() || !event.text.empty()) {
      delta.set_request_id(request_id);
      v1::TokenDelta* d = delta.mutable_delta();
      for (int32_t id : event.token_ids) d->add_token_ids(id);
      d->mutable_text()->append(event.text);
      has_delta = true;
    }
    if (!event.finished) continue;
    flush();
    // A request that failed ends with its error status instead of a GenerationFinished.
    if (!event.status.ok()) {
      final_status = ToGrpcStatus(event.status);
      break;
    }
    v1::GenerateStreamResponse message;
    message.set_request_id(request_id);
    v1::GenerationFinished* finished_message = message.mutable_finished();
    finished_message->set_finish_reason(ToProto(event.finish_reason));
    finished_message->set_stop_string(event.stop_string);
    finished_message->mutable_usage()->set_prompt_tokens(static_cast<int32_t>(event.prompt_tokens));
    finished_message->mutable_usage()->set_completion_tokens(
        static_cast<int32_t>(event.completion_tokens));
    FillSpecStats(speculation, event.stats, finished_message->mutable_spec());
    Append(message);
    if (!final_status) final_status = grpc::Status::OK;
  }
  flush();
}

void GenerateStreamReactor::Shared::Pump() {
  if (reactor == nullptr || finished || write_in_flight) return;
  if (cancelled) {
    finished = true;
    reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"));
    return;
  }
  if (pending.empty() && !final_status && channel) TakeEvents();
  if (!pending.empty()) {
    writing = std::move(pending.front());
    pending.pop_front();
    write_in_flight = true;
    reactor->StartWrite(&writing);
    return;
  }
  if (final_status) {
    finished = true;
    reactor->Finish(*final_status);
  }
}

GenerateStreamReactor* GenerateStreamReactor::Refuse(const grpc::Status& status) {
  auto* reactor = new GenerateStreamReactor();
  reactor->Finish(status);
  return reactor;
}

GenerateStreamReactor::WriteStarter& GenerateStreamReactor::WriteStarter::Get() {
  static WriteStarter starter;
  return starter;
}

GenerateStreamReactor::WriteStarter::WriteStarter() : thread_([this] { Run(); }) {}

GenerateStreamReactor::WriteStarter::~WriteStarter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void GenerateStreamReactor::WriteStarter::Post(std::weak_ptr<Shared> call) {
  bool was_empty;
  {
    std::lock_guard<std::mutex> lock(mu_);
    was_empty = posted_.empty();
    posted_.push_back(std::move(call));
  }
  // A step's pushes to many calls wake the thread once.
  if (was_empty) wake_.notify_one();
}

void GenerateStreamReactor::WriteStarter::Run() {
  std::vector<std::weak_ptr<Shared>> calls;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !posted_.empty(); });
      if (posted_.empty()) return;  // stopping, nothing left
      calls.swap(posted_);
    }
    for (const std::weak_ptr<Shared>& weak : calls) {
      if (std::shared_ptr<Shared> call = weak.lock()) {
        std::lock_guard<std::mutex> lock(call->mu);
        call->Pump();
      }
    }
    calls.clear();
  }
}

GenerateStreamReactor* GenerateStreamReactor::Start(EngineLoop* loop, LoopRequest request,
                                                    std::string request_id,
                                                    SpeculationSettings speculation,
                                                    std::function<void(const Status&)> on_refused,
                                                    std::function<void()> on_done) {
  auto* reactor = new GenerateStreamReactor();
  reactor->on_done_ = std::move(on_done);
  auto shared = std::make_shared<Shared>();
  shared->reactor = reactor;
  shared->loop = loop;
  shared->request_id = std::move(request_id);
  shared->speculation = std::move(speculation);
  reactor->shared_ = shared;
  // The channel keeps the listener for as long as the engine knows the request: a weak
  // reference, so a finished call's state goes with its reactor.
  std::weak_ptr<Shared> weak = shared;
  auto channel = loop->Submit(std::move(request), [weak] { WriteStarter::Get().Post(weak); });
  std::lock_guard<std::mutex> lock(shared->mu);
  if (channel.ok()) {
    shared->channel = std::move(*channel);
  } else {
    if (on_refused) on_refused(channel.status());
    shared->final_status = ToGrpcStatus(channel.status());
  }
  shared->Pump();
  return reactor;
}

void GenerateStreamReactor::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(shared_->mu);
  shared_->write_in_flight = false;
  if (!ok && !shared_->cancelled) {  // the client is gone: its request goes too
    shared_->cancelled = true;
    if (shared_->channel && !shared_->final_status) shared_->loop->Cancel(*shared_->channel);
  }
  shared_->Pump();
}

void GenerateStreamReactor::OnCancel() {
  if (!shared_) return;  // refused: already finished
  std::lock_guard<std::mutex> lock(shared_->mu);
  if (shared_->finished || shared_->cancelled) return;
  shared_->cancelled = true;
  if (shared_->channel && !shared_->final_status) shared_->loop->Cancel(*shared_->channel);
  shared_->Pump();
}

void GenerateStreamReactor::OnDone() {
  if (shared_) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->reactor = nullptr;
  }
  if (on_done_) on_done_();
  delete this;
}

}  // namespace specula::router
