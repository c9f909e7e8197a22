// The Target service (proto/specula/v1/target.proto): the verifier. It runs one speculative step
// of its LocalTargetBackend (target model, KV cache, drafters — local or RemoteDrafter) per
// StepPlan a router sends over the Run stream, and answers with the step's tokens and timings.
// One router session at a time; when it ends, every request of it is cancelled and its KV blocks
// freed.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <mutex>

#include "common/spec/local_target_backend.h"
#include "services/target/target_metrics.h"
#include "specula/v1/target.grpc.pb.h"

namespace specula::target {

class TargetService final : public v1::Target::Service {
 public:
  // `backend` and `metrics` (may be null) must outlive the service.
  explicit TargetService(LocalTargetBackend* backend, TargetMetrics* metrics = nullptr,
                         std::chrono::milliseconds session_wait = std::chrono::seconds(5));

  grpc::Status GetTargetInfo(grpc::ServerContext* context, const v1::GetTargetInfoRequest* request,
                             v1::TargetInfo* response) override;
  grpc::Status Run(grpc::ServerContext* context,
                   grpc::ServerReaderWriter<v1::StepResult, v1::StepPlan>* stream) override;

  // Requests the backend holds (tests: 0 once a session has ended).
  int32_t num_requests();

 private:
  LocalTargetBackend* backend_;
  TargetMetrics* metrics_;
  std::chrono::milliseconds session_wait_;
  std::timed_mutex session_mu_;  // held by the one open Run
  std::mutex backend_mu_;        // guards backend_ between Run and num_requests()
};

}  // namespace specula::target
