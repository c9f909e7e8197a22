// One GenerateStream call on gRPC's callback API: no thread waits on the request. The engine
// loop's push of an event (RequestChannel's listener) hands the call to a WriteStarter, whose one
// thread starts the write (the loop thread, which may be running the target's step inline, only
// queues it); each write's completion starts the next with whatever events queued meanwhile
// (merged into one token delta), and the last event finishes the call. Against a synchronous
// handler per stream, a step's tokens cost one thread wake-up instead of one per stream, and no
// thread blocks on a write.
//
// The client going away (or the call's deadline) cancels the request in the engine and ends the
// call at once, whatever the engine still sends. The state the loop's listener reaches lives in
// a shared object that outlives the reactor, so a push after the call is done touches nothing.
#pragma once

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/spec/step_contract.h"
#include "services/router/engine_loop.h"

namespace specula::router {

class GenerateStreamReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
  struct Shared;

 public:
  // Starts the writes of calls that have new events, on a thread of its own: one for the
  // process, made on first use and stopped at exit (a per-service one could be released last by
  // a call's state on its own thread).
  class WriteStarter {
   public:
    static WriteStarter& Get();
    WriteStarter();
    ~WriteStarter();  // after the calls already posted
    WriteStarter(const WriteStarter&) = delete;
    WriteStarter& operator=(const WriteStarter&) = delete;
    void Post(std::weak_ptr<Shared> call);

   private:
    void Run();
    std::mutex mu_;
    std::condition_variable wake_;
    std::vector<std::weak_ptr<Shared>> posted_;
    bool stopping_ = false;
    std::thread thread_;
  };

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
  GenerateStreamReactor() = default;

  std::shared_ptr<Shared> shared_;
  std::function<void()> on_done_;
};

}  // namespace specula::router
