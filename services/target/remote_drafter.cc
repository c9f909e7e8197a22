#include "services/target/remote_drafter.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "services/common/channel.h"
#include "services/common/engine_codec.h"
#include "services/common/grpc_status.h"
#include "services/common/tensor_codec.h"

namespace specula::target {

StatusOr<std::shared_ptr<DrafterConnection>> DrafterConnection::Connect(
    const std::string& address, std::chrono::milliseconds timeout, int32_t vocab_size,
    int32_t hidden_size, const std::string& dtype,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  std::shared_ptr<DrafterConnection> c(new DrafterConnection(
      address, services::MakeServiceChannel(address, std::move(credentials))));
  grpc::Status got = services::RetryUntil(timeout, [&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    c->info_.Clear();
    return c->stub_->GetDrafterInfo(&context, v1::GetDrafterInfoRequest(), &c->info_);
  });
  if (!got.ok()) {
    return services::FromGrpcStatus(got).WithContext(
        StrCat("drafter service at ", address, " (--drafter-address)"));
  }
  const v1::DrafterInfo& info = c->info_;
  if (info.vocab_size() != vocab_size || info.hidden_size() != hidden_size ||
      info.hidden_dtype() != services::DTypeFromName(dtype)) {
    return InvalidArgumentError(
        StrCat("the drafter service at ", address, " serves a target of vocabulary ",
               info.vocab_size(), ", hidden size ", info.hidden_size(), " and dtype ",
               services::DTypeName(info.hidden_dtype()), "; this target has ", vocab_size, ", ",
               hidden_size, " and ", dtype));
  }
  return c;
}

DrafterConnection::DrafterConnection(std::string address, std::shared_ptr<grpc::Channel> channel)
    : address_(std::move(address)),
      channel_(std::move(channel)),
      stub_(v1::Drafter::NewStub(channel_)) {}

DrafterConnection::~DrafterConnection() {
  std::lock_guard<std::mutex> lock(call_mu_);
  (void)DropStream();
}

bool DrafterConnection::connected() const {
  std::lock_guard<std::mutex> lock(call_mu_);
  std::lock_guard<std::mutex> state(mu_);
  return stream_ != nullptr && !broken_;
}

Status DrafterConnection::OpenStream() {
  context_ = std::make_unique<grpc::ClientContext>();
  stream_ = stub_->Session(context_.get());
  if (!stream_) return UnavailableError(StrCat("drafter service at ", address_, ": no stream"));
  ++session_;
  reader_ = std::thread([this, stream = stream_.get()] { ReadReplies(stream); });
  return OkStatus();
}

grpc::Status DrafterConnection::DropStream(bool cancel) {
  if (!stream_) return grpc::Status::OK;
  if (cancel) context_->TryCancel();
  if (reader_.joinable()) reader_.join();  // its Read returns false once the stream ends
  grpc::Status why = stream_->Finish();
  stream_.reset();
  context_.reset();
  std::lock_guard<std::mutex> lock(mu_);
  calls_sent_ = 0;
  replies_read_ = 0;
  replies_.clear();
  abandoned_.clear();
  unawaited_.clear();
  broken_ = false;
  return why;
}

void DrafterConnection::ReadReplies(
    grpc::ClientReaderWriter<v1::DrafterCall, v1::DrafterReply>* stream) {
  v1::DrafterReply reply;
  while (stream->Read(&reply)) {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t index = replies_read_++;
    if (abandoned_.erase(index) || unawaited_.erase(index)) continue;  // nobody waits for it
    replies_[index] = std::move(reply);
    replied_.notify_all();
  }
  std::lock_guard<std::mutex> lock(mu_);
  broken_ = true;
  replied_.notify_all();
}

StatusOr<v1::DrafterReply> DrafterConnection::Call(const v1::DrafterCall& call, uint64_t* session) {
  std::lock_guard<std::mutex> lock(call_mu_);
  bool ended = false;
  {
    std::lock_guard<std::mutex> state(mu_);
    ended = broken_;
  }
  if (ended) (void)DropStream(/*cancel=*/false);  // the service went away since the last call
  if (!stream_) RETURN_IF_ERROR(OpenStream());
  *session = session_;
  const auto deadline = std::chrono::steady_clock::now() + call_deadline_;
  uint64_t index = 0;
  {
    std::lock_guard<std::mutex> state(mu_);
    index = calls_sent_++;
  }
  // A service that does not even take the call's bytes (flow control) within the deadline is
  // treated as dead.
  watchdog_.Arm(context_.get(), call_deadline_);
  const bool sent = stream_->Write(call);
  const bool stuck = watchdog_.Disarm();
  if (!sent || stuck) {
    grpc::Status why = DropStream();
    if (stuck) {
      return DeadlineExceededError(StrCat("drafter service at ", address_, " did not take a call",
                                          " within ", call_deadline_.count(),
                                          " ms (--drafter-deadline-ms); the stream is dropped"));
    }
    return UnavailableError(StrCat("drafter service at ", address_, " is unreachable: ",
                                   why.ok() ? "stream closed" : why.error_message()));
  }
  v1::DrafterReply reply;
  bool got = false;
  size_t late = 0;
  {
    std::unique_lock<std::mutex> state(mu_);
    replied_.wait_until(state, deadline, [&] { return replies_.count(index) > 0 || broken_; });
    auto it = replies_.find(index);
    if (it != replies_.end()) {
      reply = std::move(it->second);
      replies_.erase(it);
      got = true;
    } else if (!broken_) {
      abandoned_.insert(index);
      late = abandoned_.size();
    }
  }
  if (!got && late == 0) {  // the stream ended
    grpc::Status why = DropStream(/*cancel=*/false);
    return UnavailableError(StrCat("drafter service at ", address_, " is unreachable: ",
                                   why.ok() ? "stream closed" : why.error_message()));
  }
  if (!got) {
    std::string dropped;
    if (late > static_cast<size_t>(kMaxLateReplies)) {
      (void)DropStream();
      dropped = StrCat("; ", late, " answers behind, the stream is dropped");
    }
    return DeadlineExceededError(StrCat("drafter service at ", address_, " did not answer within ",
                                        call_deadline_.count(), " ms (--drafter-deadline-ms)",
                                        dropped));
  }
  RETURN_IF_ERROR(services::StatusFromCode(reply.code(), reply.message()));
  return reply;
}

void DrafterConnection::Send(const v1::DrafterCall& call) {
  std::lock_guard<std::mutex> lock(call_mu_);
  {
    std::lock_guard<std::mutex> state(mu_);
    if (!stream_ || broken_) return;
    unawaited_.insert(calls_sent_++);
  }
  watchdog_.Arm(context_.get(), call_deadline_);
  const bool sent = stream_->Write(call);
  const bool stuck = watchdog_.Disarm();
  if (!sent || stuck) (void)DropStream();  // the next Call reconnects and reports it
}

RemoteDrafter::RemoteDrafter(std::shared_ptr<DrafterConnection> connection,
                             const v1::DrafterSpec& spec)
    : connection_(std::move(connection)),
      name_(spec.name()),
      hidden_layers_(spec.hidden_layers().begin(), spec.hidden_layers().end()) {
  if (spec.cache_blocks() > 0) {
    capacity_ = {.blocks = spec.cache_blocks(),
                 .block_size = std::max<int64_t>(spec.cache_block_size(), 1)};
  }
}

bool RemoteDrafter::Live(SeqId seq) const {
  auto it = sessions_.find(seq);
  return it != sessions_.end() && it->second == connection_->session() && connection_->connected();
}

Status RemoteDrafter::AddSequence(SeqId seq, const SamplingParams& sampling) {
  v1::DrafterCall call;
  call.set_drafter(name_);
  call.mutable_add()->set_seq(seq);
  services::ToProto(sampling, call.mutable_add()->mutable_sampling());
  uint64_t session = 0;
  RETURN_IF_ERROR(connection_->Call(call, &session).status());
  sessions_[seq] = session;
  return OkStatus();
}

void RemoteDrafter::ReleaseSequence(SeqId seq) {
  const bool live = Live(seq);
  sessions_.erase(seq);
  if (!live) return;
  v1::DrafterCall call;
  call.set_drafter(name_);
  call.mutable_release()->set_seq(seq);
  connection_->Send(call);  // not waited for: a service that is gone has released it already
}

Status RemoteDrafter::CheckAdded(SeqId seq) const {
  if (sessions_.count(seq)) return OkStatus();
  return NotFoundError(StrCat("sequence ", seq, " was not added"));
}

Status RemoteDrafter::Observe(const std::vector<DrafterObservation>& observations) {
  for (const DrafterObservation& o : observations) RETURN_IF_ERROR(CheckAdded(o.seq));
  v1::DrafterCall call;
  call.set_drafter(name_);
  for (const DrafterObservation& o : observations) {
    if (!Live(o.seq)) continue;  // added in an earlier session: the service no longer has it
    v1::Observation* m = call.mutable_observe()->add_observations();
    m->set_seq(o.seq);
    m->mutable_tokens()->Assign(o.tokens.begin(), o.tokens.end());
    for (const at::Tensor& h : o.hidden)
      RETURN_IF_ERROR(services::EncodeTensor(h, m->add_hidden()));
  }
  if (call.observe().observations().empty()) return OkStatus();
  uint64_t session = 0;
  return connection_->Call(call, &session).status();
}

StatusOr<std::vector<CandidateTree>> RemoteDrafter::Propose(
    const std::vector<DraftRequest>& requests) {
  for (const DraftRequest& r : requests) RETURN_IF_ERROR(CheckAdded(r.seq));
  std::vector<CandidateTree> trees(requests.size());
  v1::DrafterCall call;
  call.set_drafter(name_);
  std::vector<size_t> asked;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!Live(requests[i].seq)) {
      // Its state died with an earlier stream: a draft error for this sequence alone, every step.
      trees[i] = CandidateTree::Failed(
          UnavailableError(StrCat("drafter service at ", connection_->address(), " lost sequence ",
                                  requests[i].seq, "'s state (it restarted or is unreachable)")));
      continue;
    }
    v1::DraftRequest* m = call.mutable_propose()->add_requests();
    m->set_seq(requests[i].seq);
    m->set_max_nodes(requests[i].max_nodes);
    m->set_max_depth(requests[i].max_depth);
    asked.push_back(i);
  }
  if (asked.empty()) return trees;
  uint64_t session = 0;
  ASSIGN_OR_RETURN(v1::DrafterReply reply, connection_->Call(call, &session));
  if (reply.trees_size() != static_cast<int>(asked.size())) {
    return InternalError(StrCat("drafter service at ", connection_->address(), " returned ",
                                reply.trees_size(), " trees for ", asked.size(), " requests"));
  }
  for (size_t k = 0; k < asked.size(); ++k) {
    auto tree = services::FromProto(reply.trees(static_cast<int>(k)), connection_->vocab_size(),
                                    StrCat("trees[", k, "]"));
    if (!tree.ok()) {
      return Status(StatusCode::kInternal, StrCat("drafter service at ", connection_->address(),
                                                  ": ", tree.status().message()));
    }
    trees[asked[k]] = std::move(*tree);
  }
  return trees;
}

}  // namespace specula::target
