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
  {
    std::lock_guard<std::mutex> lock(mu_);
    context_ = context;
    deadline_ = std::chrono::steady_clock::now() + timeout;
    fired_ = false;
    if (!thread_.joinable()) thread_ = std::thread([this] { Watch(); });
  }
  cv_.notify_all();
}

bool StreamWatchdog::Disarm() {
  std::lock_guard<std::mutex> lock(mu_);
  context_ = nullptr;
  return fired_;
}

void StreamWatchdog::Watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (context_ == nullptr) {
      cv_.wait(lock);
      continue;
    }
    if (cv_.wait_until(lock, deadline_) == std::cv_status::timeout && context_ != nullptr &&
        std::chrono::steady_clock::now() >= deadline_) {
      context_->TryCancel();  // under mu_: Disarm cannot return (and the context die) meanwhile
      context_ = nullptr;
      fired_ = true;
    }
  }
}

}  // namespace specula::services
