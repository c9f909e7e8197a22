// The per-request channel between the engine loop (producer) and the RPC call that streams the
// request's events (consumer): a queue of events plus the call's cancellation flag. A consumer
// either blocks in Wait (a synchronous handler) or is told of each event by a listener and takes
// them with TakeAll (a callback reactor, which then writes from the producer's thread).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
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
  // Loop thread: queues an event, wakes the waiting handler and calls the listener (after the
  // event is queued, outside the channel's lock).
  void Push(LoopEvent event);
  // Handler thread: waits until at least one event is queued or `timeout` passes, then returns
  // every queued event in order (none on timeout).
  std::vector<LoopEvent> Wait(std::chrono::milliseconds timeout);
  // Every queued event in order, without waiting.
  std::vector<LoopEvent> TakeAll();
  // Called after every Push from then on (the loop thread; it must not block). Set it before the
  // request is submitted, once.
  void SetListener(std::function<void()> listener) { listener_ = std::move(listener); }

  // Handler thread: asks the loop to cancel the request (see EngineLoop::Cancel).
  void RequestCancel() { cancelled_.store(true, std::memory_order_release); }
  bool cancel_requested() const { return cancelled_.load(std::memory_order_acquire); }

 private:
  std::vector<LoopEvent> TakeLocked();  // mu_ held

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<LoopEvent> events_;
  std::function<void()> listener_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace specula::router
