// Client channels between Specula's services: insecure by default (they run inside one cluster),
// mutual TLS with credentials from TlsChannelCredentials (services/common/tls.h); keepalive
// pings so a peer that vanishes without closing its connection is noticed in seconds, and short
// reconnect backoff so a restarted peer is used again promptly.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace specula::services {

// `credentials`: null = insecure.
std::shared_ptr<grpc::Channel> MakeServiceChannel(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);

// Waits until `call` succeeds or `timeout` passes, retrying every 100-500 ms; returns the last
// status. For the first contact with a peer that may still be starting.
grpc::Status RetryUntil(std::chrono::milliseconds timeout,
                        const std::function<grpc::Status()>& call);

}  // namespace specula::services
