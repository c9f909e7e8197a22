// The target's side of the Drafter service: every drafter a drafter service holds appears to the
// target's SpecEngine as an ordinary Drafter, so the engine code is the same in one process and
// across machines. One DrafterConnection (one bidirectional stream) carries the calls of all of a
// service's drafters; the engine calls them one at a time.
//
// When the drafter service dies, calls fail with UNAVAILABLE and the engine runs the affected
// sequences without speculation. The next call opens a new stream; sequences of the old one are
// unknown to the new session, so they get failed trees (a draft error each step, no draft) and
// their observations are skipped, while sequences added after the reconnect speculate again.
//
// Every call has a deadline (`--drafter-deadline-ms`, default 500): a drafter that answers late
// costs only that call (DEADLINE_EXCEEDED: a Propose's sequences decode without a draft for the
// step, an Observe's go on without speculation) and its late answer is dropped when it comes; the
// stream stays open. A drafter that falls more than kMaxLateReplies answers behind, or does not
// even take a call's bytes within the deadline, is treated as dead: the stream is dropped.
// Releases are sent without waiting for their replies (one round trip less on the engine thread
// per finished request), and a step's catch-up Observe and its Propose go out together
// (ObserveAndPropose): a drafted step costs the engine thread one round trip, not two.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/spec/drafter.h"
#include "services/common/stream_watchdog.h"
#include "specula/v1/drafter.grpc.pb.h"

namespace specula::target {

class DrafterConnection {
 public:
  static constexpr std::chrono::milliseconds kDefaultCallDeadline{500};
  static constexpr int kMaxLateReplies = 4;

  // Fetches the service's info, retrying for up to `timeout` while it is unreachable (it may still
  // be starting). UNAVAILABLE after that; INVALID_ARGUMENT if its vocabulary, hidden size or dtype
  // differ from the target's. `credentials`: the channel's (null = insecure; mutual TLS from
  // services/common/tls.h).
  static StatusOr<std::shared_ptr<DrafterConnection>> Connect(
      const std::string& address, std::chrono::milliseconds timeout, int32_t vocab_size,
      int32_t hidden_size, const std::string& dtype,
      std::shared_ptr<grpc::ChannelCredentials> credentials = nullptr);
  ~DrafterConnection();

  // Each later call's deadline (positive).
  void set_call_deadline(std::chrono::milliseconds deadline) { call_deadline_ = deadline; }
  std::chrono::milliseconds call_deadline() const { return call_deadline_; }

  const std::string& address() const { return address_; }
  const v1::DrafterInfo& info() const { return info_; }
  int32_t vocab_size() const { return info_.vocab_size(); }
  // Incremented whenever a new stream (a new session on the service) is opened.
  uint64_t session() const { return session_; }
  // A stream is open (false after the service went away, until the next call reconnects).
  bool connected() const;

  // One call and its reply. Opens the stream if none is open; UNAVAILABLE (and the stream is
  // dropped) if the service cannot be reached or the stream breaks; DEADLINE_EXCEEDED if no reply
  // came within the call deadline; the reply's own error otherwise. `session` receives the
  // session the call ran in. Calls are serialized (one at a time).
  StatusOr<v1::DrafterReply> Call(const v1::DrafterCall& call, uint64_t* session);
  // The calls in order, every one written before any reply is awaited: one round trip for all
  // (the service answers in order). One result per call, each as Call's; a failure to write or
  // a stream that ends fails the calls not yet answered.
  std::vector<StatusOr<v1::DrafterReply>> CallAll(const std::vector<const v1::DrafterCall*>& calls,
                                                  uint64_t* session);
  // A call whose reply nobody waits for (a release: it can only fail where the service has
  // forgotten the sequence already), so the engine thread spends no round trip on it. Written on
  // the open stream, in order with the calls around it; its reply is dropped when it comes. Sends
  // nothing when no stream is open (a new session does not know the old one's sequences).
  void Send(const v1::DrafterCall& call);

 private:
  DrafterConnection(std::string address, std::shared_ptr<grpc::Channel> channel);
  // Both with call_mu_ held. DropStream cancels the stream (unless `cancel` is false: the reader
  // saw it end), waits for the reader and returns the stream's final status.
  Status OpenStream();
  grpc::Status DropStream(bool cancel = true);
  // With call_mu_ held: a stream the service ended is dropped, and one is opened if none is.
  Status EnsureStream();
  // With call_mu_ held: writes `call`. A service that does not take its bytes (flow control)
  // within the call deadline is treated as dead: the stream is dropped and DEADLINE_EXCEEDED
  // returned; UNAVAILABLE (stream dropped) if the write fails.
  // `more_follow`: another call is written right after, so this one may wait to go out with it
  // (one packet and one wake-up of the service for the pair).
  Status Write(const v1::DrafterCall& call, bool more_follow = false);
  Status Unreachable(const grpc::Status& why) const;
  // The reader thread: files every reply under its call's index, drops late ones.
  void ReadReplies(grpc::ClientReaderWriter<v1::DrafterCall, v1::DrafterReply>* stream);

  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Drafter::Stub> stub_;
  v1::DrafterInfo info_;
  std::chrono::milliseconds call_deadline_ = kDefaultCallDeadline;
  mutable std::mutex call_mu_;  // one call at a time; guards the stream's lifetime
  std::unique_ptr<grpc::ClientContext> context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::DrafterCall, v1::DrafterReply>> stream_;
  std::thread reader_;
  services::StreamWatchdog watchdog_;  // a Write the service does not take
  std::atomic<uint64_t> session_{0};
  // Shared with the reader thread, under mu_. Calls and replies are numbered in stream order.
  mutable std::mutex mu_;
  std::condition_variable replied_;
  uint64_t calls_sent_ = 0;
  uint64_t replies_read_ = 0;
  std::map<uint64_t, v1::DrafterReply> replies_;  // read, not yet taken
  std::set<uint64_t> abandoned_;                  // calls that timed out: drop their replies
  std::set<uint64_t> unawaited_;                  // calls made by Send: drop their replies
  bool broken_ = false;                           // the reader saw the stream end
  // The reply the engine thread waits for: the reader wakes it for that one (or a later one, or
  // the stream's end) only, so a step's observe-and-propose pair costs it one wake-up, not two.
  static constexpr uint64_t kNoWaiter = ~uint64_t{0};
  uint64_t wake_at_ = kNoWaiter;
};

class RemoteDrafter : public Drafter {
 public:
  // `name` must be one of the connection's drafters.
  RemoteDrafter(std::shared_ptr<DrafterConnection> connection, const v1::DrafterSpec& spec);

  std::string name() const override { return name_; }
  const std::vector<int64_t>& hidden_layers() const override { return hidden_layers_; }
  Status AddSequence(SeqId seq, const SamplingParams& sampling) override;
  void ReleaseSequence(SeqId seq) override;
  Status Observe(const std::vector<DrafterObservation>& observations) override;
  StatusOr<std::vector<CandidateTree>> Propose(const std::vector<DraftRequest>& requests) override;
  // Both calls on the stream before either reply is awaited: one round trip per step.
  StatusOr<std::vector<CandidateTree>> ObserveAndPropose(
      const std::vector<DrafterObservation>& observations,
      const std::vector<DraftRequest>& requests, Status* observed) override;
  // As the service advertised it (DrafterSpec.cache_blocks): the target's engine reserves in it.
  DrafterCapacity capacity() const override { return capacity_; }

 private:
  // Sequences added in the connection's current session.
  bool Live(SeqId seq) const;
  // Live, or its add goes out first in the batch being built (`adding`).
  bool Sendable(SeqId seq, const std::vector<SeqId>& adding) const;
  // The add's error for a sequence whose add failed (OK otherwise).
  Status AddError(SeqId seq) const;
  // NOT_FOUND for a sequence never added (or released): the contract every drafter keeps. One
  // added in an earlier session is known; its calls are skipped or get Failed trees.
  Status CheckAdded(SeqId seq) const;
  // The service call for an Observe (sequences of an earlier session left out) or a Propose
  // (`asked`: the requests it carries; `trees` pre-filled with Failed trees for the others), and
  // the trees of a Propose's reply put in place. Errors as the calls' own.
  Status ObserveCall(const std::vector<DrafterObservation>& observations,
                     const std::vector<SeqId>& adding, v1::DrafterCall* call) const;
  Status ProposeCall(const std::vector<DraftRequest>& requests, const std::vector<SeqId>& adding,
                     std::vector<CandidateTree>* trees, std::vector<size_t>* asked,
                     v1::DrafterCall* call) const;
  Status TakeTrees(const v1::DrafterReply& reply, const std::vector<size_t>& asked,
                   std::vector<CandidateTree>* trees) const;

  std::shared_ptr<DrafterConnection> connection_;
  std::string name_;
  std::vector<int64_t> hidden_layers_;
  DrafterCapacity capacity_;
  std::unordered_map<SeqId, uint64_t> sessions_;  // seq -> the session it was added in
  // Added here, not yet on the service: an add goes out with the sequence's first observation or
  // draft, in that call's round trip, so a sequence that never drafts (the budget gave it no
  // nodes: most of them at large batches) costs the service, the stream and the engine thread
  // nothing, and the step that admits it none either.
  std::unordered_map<SeqId, SamplingParams> unsent_adds_;
  std::unordered_map<SeqId, Status> failed_adds_;  // seq -> why the service refused its add
};

}  // namespace specula::target
