#include "services/router/remote_target_backend.h"

#include <utility>

#include "services/common/channel.h"
#include "services/common/grpc_status.h"
#include "services/common/step_codec.h"

namespace specula::router {

StatusOr<std::unique_ptr<RemoteTargetBackend>> RemoteTargetBackend::Connect(
    const std::string& address, std::chrono::milliseconds timeout,
    std::chrono::milliseconds step_deadline,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  if (step_deadline <= std::chrono::milliseconds::zero()) {
    return InvalidArgumentError(
        StrCat("the step deadline must be positive, got ", step_deadline.count(), " ms"));
  }
  std::unique_ptr<RemoteTargetBackend> b(new RemoteTargetBackend(
      address, services::MakeServiceChannel(address, std::move(credentials))));
  b->step_deadline_ = step_deadline;
  v1::TargetInfo info;
  grpc::Status got = services::RetryUntil(timeout, [&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    info.Clear();
    return b->stub_->GetTargetInfo(&context, v1::GetTargetInfoRequest(), &info);
  });
  if (!got.ok()) {
    return services::FromGrpcStatus(got).WithContext(
        StrCat("target at ", address, " (--target-address)"));
  }
  b->info_ = services::FromProto(info);
  if (b->info_.vocab_size <= 0 || b->info_.kv_cache_blocks <= 0 || b->info_.kv_block_size <= 0) {
    return InvalidArgumentError(
        StrCat("the target at ", address, " reported an empty vocabulary or KV cache"));
  }
  return b;
}

RemoteTargetBackend::RemoteTargetBackend(std::string address,
                                         std::shared_ptr<grpc::Channel> channel)
    : address_(std::move(address)),
      channel_(std::move(channel)),
      stub_(v1::Target::NewStub(channel_)) {}

RemoteTargetBackend::~RemoteTargetBackend() { DropStream(); }

void RemoteTargetBackend::DropStream() {
  if (!stream_) return;
  stream_->WritesDone();
  context_->TryCancel();
  (void)stream_->Finish();
  stream_.reset();
  context_.reset();
}

void RemoteTargetBackend::StartStep(StepPlan plan) {
  if (!stream_) {
    context_ = std::make_unique<grpc::ClientContext>();
    stream_ = stub_->Run(context_.get());
  }
  v1::StepPlan message;
  services::ToProto(plan, &message);
  // The deadline runs from the plan's sending: the router's own work while the target steps
  // counts against it as well, which bounds FinishStep's wait all the same.
  watchdog_.Arm(context_.get(), step_deadline_);
  started_ = true;
  sent_ = stream_->Write(message);
}

StatusOr<StepOutcome> RemoteTargetBackend::FinishStep() {
  if (!started_) return FailedPreconditionError("FinishStep without a step started");
  started_ = false;
  v1::StepResult result;
  const bool answered = sent_ && stream_->Read(&result);
  const bool timed_out = watchdog_.Disarm();
  if (!answered || timed_out) {  // an answer that raced the cancel is lost with its session
    if (answered) context_->TryCancel();
    grpc::Status why = stream_->Finish();
    stream_.reset();
    context_.reset();
    Status status = services::FromGrpcStatus(why);
    if (timed_out) {
      status = DeadlineExceededError(StrCat("no answer to a step within ", step_deadline_.count(),
                                            " ms (--target-step-deadline-s)"));
    } else if (status.ok() || status.code() == StatusCode::kCancelled) {
      status = UnavailableError("the stream closed");
    }
    // The target's own errors (a broken plan) keep their code; a lost connection is UNAVAILABLE.
    return Status(status.code(), StrCat("target at ", address_, ": ", status.message()));
  }
  return services::FromProto(result);
}

}  // namespace specula::router
