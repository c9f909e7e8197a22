#include "services/common/grpc_status.h"

namespace specula::services {

grpc::Status ToGrpcStatus(const Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), status.message());
}

Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return OkStatus();
  return StatusFromCode(static_cast<int32_t>(status.error_code()), status.error_message());
}

Status StatusFromCode(int32_t code, const std::string& message) {
  if (code == 0) return OkStatus();
  if (code < 0 || code > static_cast<int32_t>(StatusCode::kDataLoss)) {
    return Status(StatusCode::kUnknown, message);
  }
  return Status(static_cast<StatusCode>(code), message);
}

}  // namespace specula::services
