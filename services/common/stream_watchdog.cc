#include "services/common/stream_watchdog.h"

namespace specula::services {

StreamWatchdog::~StreamWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StreamWatchdog::Arm(grpc::ClientContext* context,
                         std::chrono::steady_clock::duration timeout) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    context_ = context;
    deadline_ = std::chrono::steady_clock::now() + timeout;
    fired_ = false;
    if (!thread_.joinable()) thread_ = std::thread([this] { Watch(); });
    // A thread asleep until an earlier time wakes then and finds the new deadline by itself.
    wake = deadline_ < sleeping_until_;
  }
  if (wake) cv_.notify_all();
}

bool StreamWatchdog::Disarm() {
  std::lock_guard<std::mutex> lock(mu_);
  context_ = nullptr;
  return fired_;
}

void StreamWatchdog::Watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const auto now = std::chrono::steady_clock::now();
    if (context_ != nullptr && now >= deadline_) {
      context_->TryCancel();  // under mu_: Disarm cannot return (and the context die) meanwhile
      context_ = nullptr;
      fired_ = true;
      continue;
    }
    // Armed: sleep until its deadline. Disarmed: until the last deadline all the same (the next
    // exchange usually comes long before and re-arms without a wake-up), then until woken.
    sleeping_until_ = now < deadline_ ? deadline_ : std::chrono::steady_clock::time_point::max();
    if (sleeping_until_ == std::chrono::steady_clock::time_point::max()) {
      cv_.wait(lock);
    } else {
      cv_.wait_until(lock, sleeping_until_);
    }
  }
}

}  // namespace specula::services
