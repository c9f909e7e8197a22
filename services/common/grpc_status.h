// specula::Status <-> gRPC status. specula's codes are Abseil's canonical codes, which gRPC and
// google.rpc.Code use too, so they map 1:1.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <string>

#include "common/util/status.h"

namespace specula::services {

grpc::Status ToGrpcStatus(const Status& status);
Status FromGrpcStatus(const grpc::Status& status);
// A status carried in a message as (google.rpc.Code, message); codes outside the known range
// become UNKNOWN.
Status StatusFromCode(int32_t code, const std::string& message);

}  // namespace specula::services
