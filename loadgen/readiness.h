// Waits for a server to be ready before measuring: polls gRPC health checking (grpc.health.v1,
// service "") until it answers SERVING.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "common/util/status.h"

namespace specula::loadgen {

// OK once the server at `channel` reports SERVING; DEADLINE_EXCEEDED naming `address`, the time
// waited and the last answer when `timeout_s` passes first. timeout_s <= 0 skips the check.
Status WaitForServing(const std::shared_ptr<grpc::Channel>& channel, const std::string& address,
                      double timeout_s);

}  // namespace specula::loadgen
