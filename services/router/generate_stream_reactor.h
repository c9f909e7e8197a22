// One GenerateStream call on gRPC's callback API: no thread waits on the request. The engine
// loop's push of an event (RequestChannel's listener) starts the write of it, on the loop's
// thread; each write's completion starts the next with whatever events queued meanwhile (merged
// into one token delta), and the last event finishes the call. Against a synchronous handler per
// stream, a token costs no thread wake-up for the handler and no blocking write.
//
// The client going away (or the call's deadline) cancels the request in the engine and ends the
// call at once, whatever the engine still sends. The state the loop's listener reaches lives in
// a shared object that outlives the reactor, so a push after the call is done touches nothing.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/spec/step_contract.h"
#include "services/router/engine_loop.h"

namespace specula::router {

class GenerateStreamReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // Ends the call with `status` without streaming anything (a refused request).
  static GenerateStreamReactor* Refuse(const grpc::Status& status);

  // Submits `request` to `loop` and streams its events. `on_done` runs once the call is over
  // (its last message written or the client gone). A refused submission ends the call with
  // that status; `on_refused` (if given) sees it first.
  static GenerateStreamReactor* Start(EngineLoop* loop, LoopRequest request, std::string request_id,
                                      SpeculationSettings speculation,
                                      std::function<void(const Status&)> on_refused,
                                      std::function<void()> on_done);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  struct Shared;
  GenerateStreamReactor() = default;

  std::shared_ptr<Shared> shared_;
  std::function<void()> on_done_;
};

}  // namespace specula::router
