#include "services/router/request_channel.h"

namespace specula::router {

void RequestChannel::Push(LoopEvent event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(event));
  }
  cv_.notify_one();
  if (listener_) listener_();
}

std::vector<LoopEvent> RequestChannel::Wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !events_.empty(); });
  return TakeLocked();
}

std::vector<LoopEvent> RequestChannel::TakeAll() {
  std::lock_guard<std::mutex> lock(mu_);
  return TakeLocked();
}

std::vector<LoopEvent> RequestChannel::TakeLocked() {
  std::vector<LoopEvent> out(std::make_move_iterator(events_.begin()),
                             std::make_move_iterator(events_.end()));
  events_.clear();
  return out;
}

}  // namespace specula::router
