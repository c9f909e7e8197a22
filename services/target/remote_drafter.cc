#include "services/target/remote_drafter.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "services/common/channel.h"
#include "services/common/engine_codec.h"
#include "services/common/grpc_status.h"
#include "services/common/tensor_codec.h"

namespace specula::target {
namespace {

// The sequences a call is about.
std::vector<SeqId> SeqsOf(const std::vector<DrafterObservation>& observations,
                          const std::vector<DraftRequest>& requests) {
  std::vector<SeqId> seqs;
  seqs.reserve(observations.size() + requests.size());
  for (const DrafterObservation& o : observations) seqs.push_back(o.seq);
  for (const DraftRequest& r : requests) seqs.push_back(r.seq);
  return seqs;
}

}  // namespace

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
    if (index >= wake_at_) replied_.notify_all();
  }
  std::lock_guard<std::mutex> lock(mu_);
  broken_ = true;
  replied_.notify_all();
}

StatusOr<v1::DrafterReply> DrafterConnection::Call(const v1::DrafterCall& call, uint64_t* session) {
  return std::move(CallAll({&call}, session)[0]);
}

Status DrafterConnection::Unreachable(const grpc::Status& why) const {
  return UnavailableError(StrCat("drafter service at ", address_, " is unreachable: ",
                                 why.ok() ? "stream closed" : why.error_message()));
}

Status DrafterConnection::EnsureStream() {
  bool ended = false;
  {
    std::lock_guard<std::mutex> state(mu_);
    ended = broken_;
  }
  if (ended) (void)DropStream(/*cancel=*/false);  // the service went away since the last call
  return stream_ ? OkStatus() : OpenStream();
}

Status DrafterConnection::Write(const v1::DrafterCall& call, bool more_follow) {
  watchdog_.Arm(context_.get(), call_deadline_);
  grpc::WriteOptions options;
  if (more_follow) options.set_buffer_hint();
  const bool sent = stream_->Write(call, options);
  const bool stuck = watchdog_.Disarm();
  if (sent && !stuck) return OkStatus();
  grpc::Status why = DropStream();
  if (stuck) {
    return DeadlineExceededError(StrCat("drafter service at ", address_,
                                        " did not take a call within ", call_deadline_.count(),
                                        " ms (--drafter-deadline-ms); the stream is dropped"));
  }
  return Unreachable(why);
}

std::vector<StatusOr<v1::DrafterReply>> DrafterConnection::CallAll(
    const std::vector<const v1::DrafterCall*>& calls, uint64_t* session) {
  std::lock_guard<std::mutex> lock(call_mu_);
  auto all_fail = [&](const Status& why) {
    return std::vector<StatusOr<v1::DrafterReply>>(calls.size(), why);
  };
  if (Status open = EnsureStream(); !open.ok()) return all_fail(open);
  *session = session_;
  // Every call goes out before any reply is awaited: the service answers them in order, so the
  // batch costs one round trip.
  std::vector<uint64_t> index(calls.size());
  std::chrono::steady_clock::time_point deadline;  // the last call's
  for (size_t i = 0; i < calls.size(); ++i) {
    {
      std::lock_guard<std::mutex> state(mu_);
      index[i] = calls_sent_++;
    }
    deadline = std::chrono::steady_clock::now() + call_deadline_;
    if (Status written = Write(*calls[i], /*more_follow=*/i + 1 < calls.size()); !written.ok()) {
      return all_fail(written);
    }
  }
  std::vector<StatusOr<v1::DrafterReply>> results;
  results.reserve(calls.size());
  size_t late = 0;
  bool ended_while_waiting = false;
  std::unique_lock<std::mutex> state(mu_);
  // The service answers in order: once the last reply is in, so are the others.
  wake_at_ = index.back();
  replied_.wait_until(state, deadline, [&] { return replies_.count(index.back()) > 0 || broken_; });
  wake_at_ = kNoWaiter;
  for (size_t i = 0; i < calls.size(); ++i) {
    auto it = replies_.find(index[i]);
    if (it != replies_.end()) {
      v1::DrafterReply reply = std::move(it->second);
      replies_.erase(it);
      Status status = services::StatusFromCode(reply.code(), reply.message());
      if (status.ok()) {
        results.emplace_back(std::move(reply));
      } else {
        results.emplace_back(std::move(status));
      }
    } else if (broken_) {
      ended_while_waiting = true;
      break;
    } else {
      abandoned_.insert(index[i]);
      late = abandoned_.size();
      results.emplace_back(Status(StatusCode::kDeadlineExceeded, ""));  // worded below
    }
  }
  state.unlock();
  if (ended_while_waiting) {
    const Status status = Unreachable(DropStream(/*cancel=*/false));
    while (results.size() < calls.size()) results.emplace_back(status);
    return results;
  }
  if (late > 0) {
    std::string dropped;
    if (late > static_cast<size_t>(kMaxLateReplies)) {
      (void)DropStream();
      dropped = StrCat("; ", late, " answers behind, the stream is dropped");
    }
    const Status status = DeadlineExceededError(
        StrCat("drafter service at ", address_, " did not answer within ", call_deadline_.count(),
               " ms (--drafter-deadline-ms)", dropped));
    for (auto& r : results) {
      if (!r.ok() && r.status().code() == StatusCode::kDeadlineExceeded &&
          r.status().message().empty()) {
        r = status;
      }
    }
  }
  return results;
}

void DrafterConnection::Send(const v1::DrafterCall& call) {
  std::lock_guard<std::mutex> lock(call_mu_);
  {
    std::lock_guard<std::mutex> state(mu_);
    if (!stream_ || broken_) return;
    unawaited_.insert(calls_sent_++);
  }
  (void)Write(call);  // a failure drops the stream: the next Call reconnects and reports it
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

bool RemoteDrafter::Sendable(SeqId seq, const std::vector<SeqId>& adding) const {
  return Live(seq) || std::find(adding.begin(), adding.end(), seq) != adding.end();
}

Status RemoteDrafter::AddSequence(SeqId seq, const SamplingParams& sampling) {
  // What the service refuses whatever its state is refused here, at once, as every drafter does
  // (the Drafter contract): a sequence this session has, invalid sampling parameters.
  if (Live(seq) || unsent_adds_.count(seq)) {
    return AlreadyExistsError(StrCat("add.seq: sequence ", seq, " already exists"));
  }
  if (Status valid = sampling.Validate(); !valid.ok()) {
    return Status(valid.code(), "add.sampling." + valid.message());
  }
  sessions_.erase(seq);  // an earlier session's
  failed_adds_.erase(seq);
  unsent_adds_[seq] = sampling;
  return OkStatus();
}

Status RemoteDrafter::AddError(SeqId seq) const {
  auto it = failed_adds_.find(seq);
  return it == failed_adds_.end() ? OkStatus() : it->second;
}

void RemoteDrafter::ReleaseSequence(SeqId seq) {
  failed_adds_.erase(seq);
  if (unsent_adds_.erase(seq)) return;  // the service never heard of it
  const bool live = Live(seq);
  sessions_.erase(seq);
  if (!live) return;
  v1::DrafterCall call;
  call.set_drafter(name_);
  call.mutable_release()->set_seq(seq);
  connection_->Send(call);  // not waited for: a service that is gone has released it already
}

Status RemoteDrafter::CheckAdded(SeqId seq) const {
  if (sessions_.count(seq) || unsent_adds_.count(seq)) return OkStatus();
  return NotFoundError(StrCat("sequence ", seq, " was not added"));
}

Status RemoteDrafter::ObserveCall(const std::vector<DrafterObservation>& observations,
                                  const std::vector<SeqId>& adding, v1::DrafterCall* call) const {
  for (const DrafterObservation& o : observations) RETURN_IF_ERROR(CheckAdded(o.seq));
  call->set_drafter(name_);
  for (const DrafterObservation& o : observations) {
    // Added in an earlier session (the service no longer has it), or the service refused it.
    if (!Sendable(o.seq, adding) || !AddError(o.seq).ok()) continue;
    v1::Observation* m = call->mutable_observe()->add_observations();
    m->set_seq(o.seq);
    m->mutable_tokens()->Assign(o.tokens.begin(), o.tokens.end());
    for (const at::Tensor& h : o.hidden)
      RETURN_IF_ERROR(services::EncodeTensor(h, m->add_hidden()));
  }
  return OkStatus();
}

Status RemoteDrafter::Observe(const std::vector<DrafterObservation>& observations) {
  Status observed;
  (void)ObserveAndPropose(observations, {}, &observed);
  return observed;
}

Status RemoteDrafter::ProposeCall(const std::vector<DraftRequest>& requests,
                                  const std::vector<SeqId>& adding,
                                  std::vector<CandidateTree>* trees, std::vector<size_t>* asked,
                                  v1::DrafterCall* call) const {
  for (const DraftRequest& r : requests) RETURN_IF_ERROR(CheckAdded(r.seq));
  trees->assign(requests.size(), CandidateTree());
  call->set_drafter(name_);
  for (size_t i = 0; i < requests.size(); ++i) {
    if (Status refused = AddError(requests[i].seq); !refused.ok()) {
      (*trees)[i] = CandidateTree::Failed(refused);  // a draft error for this sequence alone
      continue;
    }
    if (!Sendable(requests[i].seq, adding)) {
      // Its state died with an earlier stream: a draft error for this sequence alone, every step.
      (*trees)[i] = CandidateTree::Failed(
          UnavailableError(StrCat("drafter service at ", connection_->address(), " lost sequence ",
                                  requests[i].seq, "'s state (it restarted or is unreachable)")));
      continue;
    }
    v1::DraftRequest* m = call->mutable_propose()->add_requests();
    m->set_seq(requests[i].seq);
    m->set_max_nodes(requests[i].max_nodes);
    m->set_max_depth(requests[i].max_depth);
    m->set_min_reach(requests[i].min_reach);
    m->set_depth_reach(requests[i].depth_reach);
    asked->push_back(i);
  }
  return OkStatus();
}

Status RemoteDrafter::TakeTrees(const v1::DrafterReply& reply, const std::vector<size_t>& asked,
                                std::vector<CandidateTree>* trees) const {
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
    (*trees)[asked[k]] = std::move(*tree);
  }
  return OkStatus();
}

StatusOr<std::vector<CandidateTree>> RemoteDrafter::Propose(
    const std::vector<DraftRequest>& requests) {
  Status observed;
  return ObserveAndPropose({}, requests, &observed);
}

StatusOr<std::vector<CandidateTree>> RemoteDrafter::ObserveAndPropose(
    const std::vector<DrafterObservation>& observations, const std::vector<DraftRequest>& requests,
    Status* observed) {
  // The adds not sent yet of the sequences here, the Observe and the Propose: one batch on the
  // stream, one round trip. A refused add is the one case for a second: the service refused the
  // whole Observe or Propose naming that sequence (and applied nothing of it), so what was not
  // applied goes again without it.
  const std::vector<DrafterObservation> none;
  const std::vector<DrafterObservation>* to_observe = &observations;
  for (int attempt = 0;; ++attempt) {
    std::vector<SeqId> adding;
    std::vector<v1::DrafterCall> adds;
    for (SeqId seq : SeqsOf(*to_observe, requests)) {
      auto it = unsent_adds_.find(seq);
      if (it == unsent_adds_.end() ||
          std::find(adding.begin(), adding.end(), seq) != adding.end()) {
        continue;
      }
      adding.push_back(seq);
      v1::DrafterCall& add = adds.emplace_back();
      add.set_drafter(name_);
      add.mutable_add()->set_seq(seq);
      services::ToProto(it->second, add.mutable_add()->mutable_sampling());
    }
    v1::DrafterCall observe;
    *observed = ObserveCall(*to_observe, adding, &observe);
    if (!observed->ok()) return *observed;
    const bool observes = !observe.observe().observations().empty();
    std::vector<CandidateTree> trees;
    std::vector<size_t> asked;
    v1::DrafterCall propose;
    const Status proposable = ProposeCall(requests, adding, &trees, &asked, &propose);
    const bool proposes = proposable.ok() && !asked.empty();
    std::vector<const v1::DrafterCall*> calls;
    for (const v1::DrafterCall& add : adds) calls.push_back(&add);
    if (observes) calls.push_back(&observe);
    if (proposes) calls.push_back(&propose);
    std::vector<StatusOr<v1::DrafterReply>> replies;
    uint64_t session = 0;
    if (!calls.empty()) replies = connection_->CallAll(calls, &session);
    bool refused = false;
    for (size_t i = 0; i < adding.size(); ++i) {
      const SeqId seq = adding[i];
      const Status& added = replies[i].status();
      if (added.code() == StatusCode::kUnavailable) continue;  // unsent still: the next call tries
      unsent_adds_.erase(seq);
      sessions_[seq] = session;
      if (!added.ok()) {
        failed_adds_[seq] = added.WithContext(StrCat("adding sequence ", seq));
        refused = true;
      }
    }
    size_t next = adding.size();
    if (observes) *observed = replies[next++].status();
    const bool propose_failed = proposes && !replies[next].ok();
    if (refused && attempt == 0 && (!observed->ok() || propose_failed)) {
      if (observed->ok()) to_observe = &none;  // applied: not again
      continue;
    }
    if (!observed->ok()) return *observed;  // the proposals came from the state before it
    RETURN_IF_ERROR(proposable);
    if (!proposes) return trees;
    RETURN_IF_ERROR(replies[next].status());
    RETURN_IF_ERROR(TakeTrees(*replies[next], asked, &trees));
    if (refused) {  // whatever the service answered for it, its state is not there
      for (size_t i : asked) {
        if (Status why = AddError(requests[i].seq); !why.ok())
          trees[i] = CandidateTree::Failed(why);
      }
    }
    return trees;
  }
}

}  // namespace specula::target
