// The router's gRPC client of the Target service: a TargetBackend whose steps run in another
// process (`specula serve --role router --target-address HOST:PORT`). One Run stream carries the
// session: StartStep writes a plan, FinishStep reads its result; a step that cannot be sent or
// answered drops the stream and fails with UNAVAILABLE (the router then fails the requests it
// held), and the next step opens a new session. A step that gets no answer within the step deadline
// (`--target-step-deadline-s`: a hung target) fails the same way with DEADLINE_EXCEEDED, so the
// router's loop, and with it every client's cancellation, never waits on a hung target for longer
// than that.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/spec/target_backend.h"
#include "services/common/stream_watchdog.h"
#include "specula/v1/target.grpc.pb.h"

namespace specula::router {

class RemoteTargetBackend : public TargetBackend {
 public:
  static constexpr std::chrono::milliseconds kDefaultStepDeadline{30000};

  // Fetches the target's info, retrying for up to `timeout` while it is unreachable. Each Step
  // must be answered within `step_deadline`. `credentials`: the channel's (null = insecure; mutual
  // TLS from services/common/tls.h).
  static StatusOr<std::unique_ptr<RemoteTargetBackend>> Connect(
      const std::string& address, std::chrono::milliseconds timeout,
      std::chrono::milliseconds step_deadline = kDefaultStepDeadline,
      std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);
  ~RemoteTargetBackend() override;

  TargetInfo info() const override { return info_; }
  void StartStep(StepPlan plan) override;
  StatusOr<StepOutcome> FinishStep() override;

 private:
  RemoteTargetBackend(std::string address, std::shared_ptr<grpc::Channel> channel);
  void DropStream();

  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Target::Stub> stub_;
  TargetInfo info_;
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StepPlan, v1::StepResult>> stream_;
  std::chrono::milliseconds step_deadline_ = kDefaultStepDeadline;
  bool started_ = false;  // a step is in flight
  bool sent_ = false;     // and its plan was written
  services::StreamWatchdog watchdog_;
};

}  // namespace specula::router
