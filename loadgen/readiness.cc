#include "loadgen/readiness.h"

#include <chrono>
#include <thread>

#include "grpc/health/v1/health.grpc.pb.h"

namespace specula::loadgen {

Status WaitForServing(const std::shared_ptr<grpc::Channel>& channel, const std::string& address,
                      double timeout_s) {
  if (timeout_s <= 0) return OkStatus();
  namespace health = grpc::health::v1;
  auto stub = health::Health::NewStub(channel);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(timeout_s));
  std::string last = "no answer";
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    health::HealthCheckRequest request;
    health::HealthCheckResponse response;
    grpc::Status status = stub->Check(&context, request, &response);
    if (status.ok() && response.status() == health::HealthCheckResponse::SERVING) {
      return OkStatus();
    }
    last = status.ok() ? StrCat("status ",
                                health::HealthCheckResponse::ServingStatus_Name(response.status()))
                       : StrCat("gRPC ", status.error_code(), ": ", status.error_message());
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  return DeadlineExceededError(StrCat("server at ", address, " not SERVING after ", timeout_s,
                                      " s (--ready-check-timeout-sec): ", last));
}

}  // namespace specula::loadgen
