#include "services/common/channel.h"

#include <algorithm>
#include <functional>
#include <thread>

namespace specula::services {

std::shared_ptr<grpc::Channel> MakeServiceChannel(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Hidden states of a long prompt can exceed gRPC's 4 MB default.
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  if (!credentials) credentials = grpc::InsecureChannelCredentials();
  return grpc::CreateCustomChannel(address, credentials, args);
}

grpc::Status RetryUntil(std::chrono::milliseconds timeout,
                        const std::function<grpc::Status()>& call) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::chrono::milliseconds wait(100);
  while (true) {
    grpc::Status status = call();
    if (status.ok() || status.error_code() != grpc::StatusCode::UNAVAILABLE ||
        std::chrono::steady_clock::now() + wait >= deadline) {
      return status;
    }
    std::this_thread::sleep_for(wait);
    wait = std::min(wait * 2, std::chrono::milliseconds(500));
  }
}

}  // namespace specula::services
