#include "services/target/target_service.h"

#include "services/common/engine_codec.h"
#include "services/common/grpc_status.h"

namespace specula::target {

TargetService::TargetService(LocalTargetBackend* backend, TargetMetrics* metrics,
                             std::chrono::milliseconds session_wait)
    : backend_(backend), metrics_(metrics), session_wait_(session_wait) {}

grpc::Status TargetService::GetTargetInfo(grpc::ServerContext*, const v1::GetTargetInfoRequest*,
                                          v1::TargetInfo* response) {
  std::lock_guard<std::mutex> lock(backend_mu_);
  services::ToProto(backend_->info(), response);
  return grpc::Status::OK;
}

int32_t TargetService::num_requests() {
  std::lock_guard<std::mutex> lock(backend_mu_);
  return backend_->num_requests();
}

grpc::Status TargetService::Run(grpc::ServerContext* context,
                                grpc::ServerReaderWriter<v1::StepResult, v1::StepPlan>* stream) {
  std::unique_lock<std::timed_mutex> session(session_mu_, std::defer_lock);
  if (!session.try_lock_for(session_wait_)) {
    return grpc::Status(grpc::StatusCode::ABORTED,
                        "another router holds this target's session (one router per target)");
  }
  if (metrics_) metrics_->SessionStarted();
  grpc::Status ended = grpc::Status::OK;
  v1::StepPlan message;
  while (stream->Read(&message)) {
    auto plan = services::FromProto(message);
    if (!plan.ok()) {
      ended = services::ToGrpcStatus(plan.status().WithContext("plan"));
      break;
    }
    StatusOr<StepOutcome> outcome = [&]() -> StatusOr<StepOutcome> {
      std::lock_guard<std::mutex> lock(backend_mu_);
      // An exception must still end the session below (CancelAll), or the router's KV blocks
      // would stay taken; escaping into gRPC it would skip that.
      try {
        auto out = backend_->Step(std::move(*plan));
        if (out.ok() && metrics_) {
          metrics_->Step(*out, backend_->num_requests(), backend_->target().kv_stats().usage());
        }
        return out;
      } catch (const std::exception& e) {
        const std::string what = e.what();
        return InternalError(StrCat("target step failed: ", what.substr(0, what.find('\n'))));
      }
    }();
    if (!outcome.ok()) {
      ended = services::ToGrpcStatus(outcome.status());
      break;
    }
    v1::StepResult result;
    services::ToProto(*outcome, &result);
    if (!stream->Write(result)) break;
  }
  // The router is gone (or broke the protocol): nothing of its session may keep KV blocks.
  // The gauges too: no later step would update them while no router is connected.
  std::lock_guard<std::mutex> lock(backend_mu_);
  backend_->CancelAll();
  if (metrics_) metrics_->Load(backend_->num_requests(), backend_->target().kv_stats().usage());
  return ended;
}

}  // namespace specula::target
