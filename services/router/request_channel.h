// The per-request channel between the engine loop (producer) and the RPC handler waiting on the
// request (consumer): a queue of events plus the handler's cancellation flag.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "common/engine/finish_reason.h"
#include "common/spec/step_contract.h"
#include "common/util/status.h"

namespace specula::router {

// What one engine step produced for a request; the last event of a request has `finished` set.
struct LoopEvent {
  std::vector<int32_t> token_ids;  // tokens generated this step
  std::string text;                // text those tokens complete (see StopStringMatcher)
  bool finished = false;
  // Set on the last event:
  FinishReason finish_reason = FinishReason::kLength;
  // Not OK when the request did not complete: CANCELLED, DEADLINE_EXCEEDED, UNAVAILABLE
  // (shutdown), RESOURCE_EXHAUSTED (never fits the KV cache), INTERNAL (engine failure).
  Status status;
  std::string stop_string;  // kStopString: the stop string that matched
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // tokens delivered in all events
  SpecRequestStats stats;
};

class RequestChannel {
 public:
  // Loop thread: queues an event and wakes the waiting handler.
  void Push(LoopEvent event);
  // Handler thread: waits until at least one event is queued or `timeout` passes, then returns
  // every queued event in order (none on timeout).
  std::vector<LoopEvent> Wait(std::chrono::milliseconds timeout);

  // Handler thread: asks the loop to cancel the request (see EngineLoop::Cancel).
  void RequestCancel() { cancelled_.store(true, std::memory_order_release); }
  bool cancel_requested() const { return cancelled_.load(std::memory_order_acquire); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<LoopEvent> events_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace specula::router
