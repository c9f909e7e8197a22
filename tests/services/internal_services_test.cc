// The internal Target and Drafter services over real gRPC on 127.0.0.1: hidden states reach a
// remote drafter bit for bit as an in-process drafter sees them; malformed peer messages (tensors
// of the wrong dtype, shape or size, unknown sequences, broken trees, broken step plans) get errors
// that name the field, and the services keep serving.
#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "common/spec/local_target_backend.h"
#include "services/common/service_server.h"
#include "services/common/step_codec.h"
#include "services/common/tensor_codec.h"
#include "services/drafter/drafter_service.h"
#include "services/target/remote_drafter.h"
#include "services/target/target_service.h"
#include "tests/services/served_test_model.h"

namespace specula {
namespace {

using namespace std::chrono_literals;

// Needs hidden layers 0 and 2, records what it observes, proposes its last token twice.
class RecordingDrafter : public Drafter {
 public:
  struct Log {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::vector<at::Tensor>> hidden;
    std::vector<double> min_reach;    // of every draft request, in order
    std::vector<double> depth_reach;  // the same
  };
  explicit RecordingDrafter(std::shared_ptr<Log> log) : log_(std::move(log)) {}
  std::string name() const override { return "recording"; }
  const std::vector<int64_t>& hidden_layers() const override { return layers_; }
  std::vector<int64_t> layers_ = {0, 2};
  Status AddSequence(SeqId seq, const SamplingParams&) override {
    last_[seq] = 0;
    return OkStatus();
  }
  void ReleaseSequence(SeqId seq) override { last_.erase(seq); }
  Status Observe(const std::vector<DrafterObservation>& observations) override {
    if (throw_observe.exchange(false)) (void)at::zeros({2}).view({3});  // throws c10::Error
    for (const DrafterObservation& o : observations) {
      log_->tokens.push_back(o.tokens);
      std::vector<at::Tensor> copies;
      for (const at::Tensor& h : o.hidden) copies.push_back(h.clone());
      log_->hidden.push_back(copies);
      last_[o.seq] = o.tokens.back();
    }
    return OkStatus();
  }
  StatusOr<std::vector<CandidateTree>> Propose(const std::vector<DraftRequest>& requests) override {
    if (throw_propose.exchange(false)) throw std::bad_alloc();
    std::vector<CandidateTree> trees;
    for (const DraftRequest& r : requests) {
      log_->min_reach.push_back(r.min_reach);
      log_->depth_reach.push_back(r.depth_reach);
      const int32_t t = last_.at(r.seq);
      std::vector<int32_t> chain(std::min(2, r.max_depth), t);
      trees.push_back(CandidateTree::Chain(chain));
    }
    return trees;
  }
  DrafterCapacity capacity() const override { return cap; }

  DrafterCapacity cap;  // unbounded unless a test sets it

  std::atomic<bool> throw_observe{false};
  std::atomic<bool> throw_propose{false};

 private:
  std::shared_ptr<Log> log_;
  std::map<SeqId, int32_t> last_;
};

std::string Address(int port) { return "127.0.0.1:" + std::to_string(port); }

class InternalServicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TinyServedModelDirs().target;
    auto config = ModelConfig::FromFile(dir_ + "/config.json");
    ASSERT_TRUE(config.ok());
    config_ = *config;
    std::vector<std::unique_ptr<Drafter>> drafters;
    auto recording = std::make_unique<RecordingDrafter>(remote_log_);
    recording_ = recording.get();
    drafters.push_back(std::move(recording));
    service_ = std::make_unique<drafter::DrafterService>(
        std::move(drafters),
        drafter::DrafterServiceOptions{.vocab_size = static_cast<int32_t>(config_.vocab_size),
                                       .hidden_size = static_cast<int32_t>(config_.hidden_size),
                                       .dtype = "float32",
                                       .context_length = config_.max_position_embeddings});
    auto server = services::ServiceServer::Start("127.0.0.1", 0, service_.get(),
                                                 v1::Drafter::service_full_name());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  std::unique_ptr<LocalTargetBackend> Target() {
    auto runner = ModelRunner::Load(dir_, {});
    EXPECT_TRUE(runner.ok()) << runner.status();
    return std::make_unique<LocalTargetBackend>(std::move(*runner));
  }

  // A target whose drafter is the service's, over a new connection (null if it fails).
  std::unique_ptr<LocalTargetBackend> RemoteTarget() {
    auto target = Target();
    auto connection = target::DrafterConnection::Connect(
        Address(server_->port()), 5s, static_cast<int32_t>(config_.vocab_size),
        static_cast<int32_t>(config_.hidden_size), "float32");
    EXPECT_TRUE(connection.ok()) << connection.status();
    if (!connection.ok()) return nullptr;
    const Status added = target->engine().AddDrafter(
        std::make_unique<target::RemoteDrafter>(*connection, (*connection)->info().drafters(0)));
    EXPECT_TRUE(added.ok()) << added;
    return added.ok() ? std::move(target) : nullptr;
  }

  static StepPlan Admit(RequestId id, std::vector<int32_t> prompt, int64_t max_new) {
    StepPlan plan;
    SpecRequest r;
    r.generation.prompt = std::move(prompt);
    r.generation.max_new_tokens = max_new;
    r.speculation.drafter = "recording";
    r.speculation.max_draft_tokens = 2;
    plan.admit.push_back({.id = id, .request = r});
    return plan;
  }

  // Steps until every request finished; returns the tokens of request 1. `each_step`, if any,
  // makes each step's plan (from `first`, then an empty one).
  static std::vector<int32_t> RunToEnd(
      LocalTargetBackend& target, StepPlan first,
      const std::function<StepPlan(int step, StepPlan plan)>& each_step = nullptr) {
    std::vector<int32_t> tokens;
    StepPlan plan = std::move(first);
    for (int step = 0; step < 200; ++step) {
      if (each_step) plan = each_step(step, std::move(plan));
      auto out = target.Step(plan);
      EXPECT_TRUE(out.ok()) << out.status();
      if (!out.ok()) break;
      bool done = false;
      for (const RequestUpdate& u : out->report.updates) {
        tokens.insert(tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
        done |= u.finished;
      }
      if (done) break;
      plan = {};
    }
    return tokens;
  }

  std::string dir_;
  ModelConfig config_;
  std::shared_ptr<RecordingDrafter::Log> remote_log_ = std::make_shared<RecordingDrafter::Log>();
  std::unique_ptr<drafter::DrafterService> service_;
  std::unique_ptr<services::ServiceServer> server_;
  RecordingDrafter* recording_ = nullptr;  // owned by service_
};

TEST_F(InternalServicesTest, HiddenStatesReachARemoteDrafterExactlyAsInProcess) {
  auto local_log = std::make_shared<RecordingDrafter::Log>();
  auto local = Target();
  ASSERT_TRUE(local->engine().AddDrafter(std::make_unique<RecordingDrafter>(local_log)).ok());

  auto remote = Target();
  auto connection = target::DrafterConnection::Connect(
      Address(server_->port()), 5s, static_cast<int32_t>(config_.vocab_size),
      static_cast<int32_t>(config_.hidden_size), "float32");
  ASSERT_TRUE(connection.ok()) << connection.status();
  ASSERT_EQ((*connection)->info().drafters_size(), 1);
  EXPECT_EQ((*connection)->info().drafters(0).hidden_layers_size(), 2);
  ASSERT_TRUE(remote->engine()
                  .AddDrafter(std::make_unique<target::RemoteDrafter>(
                      *connection, (*connection)->info().drafters(0)))
                  .ok());

  const std::vector<int32_t> prompt = {5, 9, 13, 2, 7, 11};
  const auto a = RunToEnd(*local, Admit(1, prompt, 12));
  const auto b = RunToEnd(*remote, Admit(1, prompt, 12));
  EXPECT_EQ(a, b);
  ASSERT_EQ(local_log->tokens, remote_log_->tokens);
  ASSERT_EQ(local_log->hidden.size(), remote_log_->hidden.size());
  ASSERT_GE(local_log->hidden.size(), 2u);
  EXPECT_EQ(local_log->hidden[0][0].size(0), static_cast<int64_t>(prompt.size()));
  for (size_t i = 0; i < local_log->hidden.size(); ++i) {
    ASSERT_EQ(local_log->hidden[i].size(), 2u);
    for (size_t l = 0; l < 2; ++l) {
      EXPECT_TRUE(at::equal(local_log->hidden[i][l], remote_log_->hidden[i][l]))
          << "observation " << i << " layer " << l;
    }
  }
  // Releases are sent, not waited for (remote_drafter.h); the service answers a stream's calls in
  // order, so one round trip puts them behind us.
  v1::DrafterCall sync;
  sync.set_drafter((*connection)->info().drafters(0).name());
  sync.mutable_propose();
  uint64_t session = 0;
  ASSERT_TRUE((*connection)->Call(sync, &session).ok());
  EXPECT_EQ(service_->num_sequences(), 0) << "finished sequences were not released";
}

// A plan's quiet promises (StepPlan::DraftBudget::quiet_steps, over the wire) skip the same
// hidden states for a remote drafter as for an in-process one: it observes the same tokens with
// the same states after each quiet stretch, and the output is the target's own. (What is skipped
// is tested on the engine: SpecEngineTest.QuietStepsSkipTheStatesADrafterWillNotRead.)
TEST_F(InternalServicesTest, QuietPromisesSkipStatesAlikeForARemoteDrafter) {
  auto local_log = std::make_shared<RecordingDrafter::Log>();
  auto local = Target();
  ASSERT_TRUE(local->engine().AddDrafter(std::make_unique<RecordingDrafter>(local_log)).ok());
  auto remote = RemoteTarget();
  ASSERT_NE(remote, nullptr);
  // A draft every 40th step, each step before it promised quiet until then (the engine's
  // drafter_context, 32, leaves 6 of every 40 steps skipped); `drafts` false: never a budget.
  auto run = [](LocalTargetBackend& target, bool drafts) {
    return RunToEnd(target, Admit(1, {5, 9, 13, 2, 7, 11}, 100), [&](int step, StepPlan plan) {
      const int to_draft = 39 - step % 40;
      plan.budgets = {{.id = 1,
                       .max_draft_tokens = drafts && to_draft == 0 ? 2 : 0,
                       .quiet_steps = drafts ? to_draft : 0}};
      v1::StepPlan message;
      services::ToProto(plan, &message);
      auto back = services::FromProto(message);
      EXPECT_TRUE(back.ok()) << back.status();
      return back.ok() ? *back : StepPlan{};
    });
  };
  const auto a = run(*local, true);
  const auto b = run(*remote, true);
  EXPECT_EQ(a.size(), 100u);
  EXPECT_EQ(a, b);
  auto plain = Target();
  ASSERT_TRUE(
      plain->engine()
          .AddDrafter(std::make_unique<RecordingDrafter>(std::make_shared<RecordingDrafter::Log>()))
          .ok());
  EXPECT_EQ(run(*plain, false), a) << "the output is the target's own";
  ASSERT_EQ(local_log->tokens, remote_log_->tokens);
  ASSERT_GE(local_log->tokens.size(), 2u) << "drafts after quiet stretches";
  ASSERT_EQ(local_log->hidden.size(), remote_log_->hidden.size());
  for (size_t i = 0; i < local_log->hidden.size(); ++i) {
    for (size_t l = 0; l < 2; ++l) {
      EXPECT_TRUE(at::equal(local_log->hidden[i][l], remote_log_->hidden[i][l]))
          << "observation " << i << " layer " << l;
    }
  }
}

// The plan's prices of a row and a depth (StepPlan::DraftBudget::min_reach, depth_reach) cross the
// router -> target wire and reach a remote drafter's requests (DraftRequest's).
TEST_F(InternalServicesTest, TheRowPriceReachesARemoteDrafter) {
  auto remote = RemoteTarget();
  ASSERT_NE(remote, nullptr);
  auto over_the_wire = [](const StepPlan& plan) {
    v1::StepPlan message;
    services::ToProto(plan, &message);
    auto back = services::FromProto(message);
    EXPECT_TRUE(back.ok()) << back.status();
    return back.ok() ? *back : StepPlan{};
  };
  ASSERT_TRUE(remote->Step(over_the_wire(Admit(1, {5, 9, 13}, 8))).ok());  // prefill
  for (double price : {0.37, 0.0, 0.81}) {
    StepPlan plan;
    plan.budgets.push_back(
        {.id = 1, .max_draft_tokens = 2, .min_reach = price, .depth_reach = 3 * price});
    ASSERT_TRUE(remote->Step(over_the_wire(plan)).ok());
    ASSERT_FALSE(remote_log_->min_reach.empty()) << "no draft was asked for";
    EXPECT_DOUBLE_EQ(remote_log_->min_reach.back(), price);
    EXPECT_DOUBLE_EQ(remote_log_->depth_reach.back(), 3 * price);
  }
  // A quiet promise (StepPlan::DraftBudget::quiet_steps) crosses the wire too.
  StepPlan quiet;
  quiet.budgets.push_back({.id = 1, .max_draft_tokens = 0, .quiet_steps = 40});
  const StepPlan back = over_the_wire(quiet);
  ASSERT_EQ(back.budgets.size(), 1u);
  EXPECT_EQ(back.budgets[0].quiet_steps, 40);
}

class RawSession {
 public:
  explicit RawSession(int port)
      : stub_(v1::Drafter::NewStub(
            grpc::CreateChannel(Address(port), grpc::InsecureChannelCredentials()))),
        stream_(stub_->Session(&context_)) {}
  v1::DrafterReply Call(const v1::DrafterCall& call) {
    v1::DrafterReply reply;
    EXPECT_TRUE(stream_->Write(call));
    EXPECT_TRUE(stream_->Read(&reply));
    return reply;
  }
  ~RawSession() {
    stream_->WritesDone();
    (void)stream_->Finish();
  }

 private:
  std::unique_ptr<v1::Drafter::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::DrafterCall, v1::DrafterReply>> stream_;
};

TEST_F(InternalServicesTest, MalformedObservationsNameTheFieldAndTheSessionGoesOn) {
  RawSession session(server_->port());
  const int64_t d = config_.hidden_size;
  v1::DrafterCall add;
  add.set_drafter("recording");
  add.mutable_add()->set_seq(7);
  ASSERT_EQ(session.Call(add).code(), 0);

  // A valid first observation: 3 tokens = a 2-token prompt and the first generated token.
  auto observe = [&](std::vector<int32_t> tokens, std::vector<at::Tensor> hidden) {
    v1::DrafterCall call;
    call.set_drafter("recording");
    v1::Observation* o = call.mutable_observe()->add_observations();
    o->set_seq(7);
    for (int32_t t : tokens) o->add_tokens(t);
    for (const at::Tensor& h : hidden) EXPECT_TRUE(services::EncodeTensor(h, o->add_hidden()).ok());
    return call;
  };
  const at::Tensor good = at::randn({2, d});
  struct Case {
    v1::DrafterCall call;
    int code;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({observe({1, 2, 3}, {good}), 3,
                   "observe.observations[0].hidden: drafter 'recording' needs 2"});
  cases.push_back({observe({1, 2, 3}, {good, good.to(at::kBFloat16)}), 3,
                   "observe.observations[0].hidden[1].dtype: expected float32, got bfloat16"});
  cases.push_back({observe({1, 2, 3}, {good, at::randn({2, d + 1})}), 3,
                   "observe.observations[0].hidden[1].shape: expected [2, " + std::to_string(d) +
                       "], got [2, " + std::to_string(d + 1) + "]"});
  cases.push_back({observe({1, 2, 3, 4}, {good, good}), 3,
                   "observe.observations[0].hidden[0].shape: expected [3, "});
  Case short_data{observe({1, 2, 3}, {good, good}), 3, "observe.observations[0].hidden[0].data"};
  short_data.call.mutable_observe()
      ->mutable_observations(0)
      ->mutable_hidden(0)
      ->mutable_data()
      ->resize(7);
  cases.push_back(short_data);
  cases.push_back({observe({1, 999999, 3}, {good, good}), 3,
                   "observe.observations[0].tokens[1] = 999999 is outside the vocabulary"});
  Case unknown_seq{observe({1, 2, 3}, {good, good}), 5, "observe.observations[0].seq: unknown"};
  unknown_seq.call.mutable_observe()->mutable_observations(0)->set_seq(8);
  cases.push_back(unknown_seq);
  Case unknown_drafter{observe({1, 2, 3}, {good, good}), 3, "drafter: unknown drafter 'medusa'"};
  unknown_drafter.call.set_drafter("medusa");
  cases.push_back(unknown_drafter);
  v1::DrafterCall empty;
  empty.set_drafter("recording");
  cases.push_back({empty, 3, "call: one of add, release, observe or propose"});

  for (size_t i = 0; i < cases.size(); ++i) {
    v1::DrafterReply reply = session.Call(cases[i].call);
    EXPECT_EQ(reply.code(), cases[i].code) << i << ": " << reply.message();
    EXPECT_NE(reply.message().find(cases[i].message), std::string::npos)
        << i << ": " << reply.message();
  }
  EXPECT_TRUE(remote_log_->tokens.empty()) << "a rejected call reached the drafter";

  // The session still works: the valid observation, then a proposal.
  EXPECT_EQ(session.Call(observe({1, 2, 3}, {good, good})).code(), 0);
  ASSERT_EQ(remote_log_->tokens.size(), 1u);
  EXPECT_TRUE(at::equal(remote_log_->hidden[0][0], good));
  v1::DrafterCall propose;
  propose.set_drafter("recording");
  v1::DraftRequest* r = propose.mutable_propose()->add_requests();
  r->set_seq(7);
  r->set_max_nodes(2);
  r->set_max_depth(2);
  v1::DrafterReply trees = session.Call(propose);
  ASSERT_EQ(trees.code(), 0) << trees.message();
  ASSERT_EQ(trees.trees_size(), 1);
  EXPECT_EQ(trees.trees(0).tokens_size(), 2);
  EXPECT_EQ(trees.trees(0).tokens(0), 3);
}

// Issue 19: a drafter's exception escaped the service's handler and ended the whole session (every
// sequence of the target lost its drafter state); now it fails only its call. The drafter's cache
// capacity reaches the target, whose engine reserves in it.
TEST_F(InternalServicesTest, ADrafterExceptionFailsOnlyItsCallAndCapacityIsAdvertised) {
  recording_->cap = {.blocks = 40, .block_size = 8};
  auto connection = target::DrafterConnection::Connect(
      Address(server_->port()), 10s, static_cast<int32_t>(config_.vocab_size),
      static_cast<int32_t>(config_.hidden_size), "float32");
  ASSERT_TRUE(connection.ok()) << connection.status();
  ASSERT_EQ((*connection)->info().drafters_size(), 1);
  const v1::DrafterSpec& spec = (*connection)->info().drafters(0);
  EXPECT_EQ(spec.cache_blocks(), 40);
  EXPECT_EQ(spec.cache_block_size(), 8);
  const target::RemoteDrafter remote(*connection, spec);
  EXPECT_EQ(remote.capacity().blocks, 40);
  EXPECT_EQ(remote.capacity().block_size, 8);

  RawSession session(server_->port());
  v1::DrafterCall add;
  add.set_drafter("recording");
  add.mutable_add()->set_seq(7);
  ASSERT_EQ(session.Call(add).code(), 0);
  v1::DrafterCall observe;
  observe.set_drafter("recording");
  v1::Observation* o = observe.mutable_observe()->add_observations();
  o->set_seq(7);
  for (int32_t t : {1, 2, 3}) o->add_tokens(t);
  for (int l = 0; l < 2; ++l) {
    ASSERT_TRUE(services::EncodeTensor(at::randn({2, config_.hidden_size}), o->add_hidden()).ok());
  }
  v1::DrafterCall propose;
  propose.set_drafter("recording");
  v1::DraftRequest* r = propose.mutable_propose()->add_requests();
  r->set_seq(7);
  r->set_max_nodes(2);
  r->set_max_depth(2);

  recording_->throw_observe = true;
  v1::DrafterReply reply = session.Call(observe);
  EXPECT_EQ(reply.code(), static_cast<int>(StatusCode::kInternal));
  EXPECT_NE(reply.message().find("drafter 'recording': shape '[3]' is invalid"), std::string::npos)
      << reply.message();
  ASSERT_EQ(session.Call(observe).code(), 0) << "the session goes on";
  recording_->throw_propose = true;
  reply = session.Call(propose);
  EXPECT_EQ(reply.code(), static_cast<int>(StatusCode::kInternal));
  EXPECT_NE(reply.message().find("bad_alloc"), std::string::npos) << reply.message();
  reply = session.Call(propose);
  ASSERT_EQ(reply.code(), 0) << reply.message();
  EXPECT_EQ(reply.trees_size(), 1);
}

// A drafter service that answers every proposal with a tree whose arrays disagree.
class BrokenTreeService final : public v1::Drafter::Service {
 public:
  grpc::Status GetDrafterInfo(grpc::ServerContext*, const v1::GetDrafterInfoRequest*,
                              v1::DrafterInfo* info) override {
    info->add_drafters()->set_name("broken");
    info->set_vocab_size(vocab);
    info->set_hidden_size(hidden);
    info->set_hidden_dtype(v1::DTYPE_FLOAT32);
    return grpc::Status::OK;
  }
  grpc::Status Session(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::DrafterReply, v1::DrafterCall>* stream) override {
    v1::DrafterCall call;
    while (stream->Read(&call)) {
      v1::DrafterReply reply;
      if (call.has_propose()) {
        for (int i = 0; i < call.propose().requests_size(); ++i) {
          v1::CandidateTree* t = reply.add_trees();
          t->add_tokens(1);
          t->add_tokens(2);
          t->add_parents(-1);  // one parent for two tokens
        }
      }
      stream->Write(reply);
    }
    return grpc::Status::OK;
  }
  int32_t vocab = 0;
  int32_t hidden = 0;
};

TEST_F(InternalServicesTest, BrokenTreesFromADrafterPeerCostOnlySpeculation) {
  BrokenTreeService broken;
  broken.vocab = static_cast<int32_t>(config_.vocab_size);
  broken.hidden = static_cast<int32_t>(config_.hidden_size);
  auto server =
      services::ServiceServer::Start("127.0.0.1", 0, &broken, v1::Drafter::service_full_name());
  ASSERT_TRUE(server.ok());
  auto connection = target::DrafterConnection::Connect(Address((*server)->port()), 5s, broken.vocab,
                                                       broken.hidden, "float32");
  ASSERT_TRUE(connection.ok()) << connection.status();
  target::RemoteDrafter drafter(*connection, (*connection)->info().drafters(0));
  ASSERT_TRUE(drafter.AddSequence(42, {}).ok());
  auto trees = drafter.Propose({{.seq = 42, .max_nodes = 4, .max_depth = 4}});
  ASSERT_FALSE(trees.ok());
  EXPECT_EQ(trees.status().code(), StatusCode::kInternal);
  EXPECT_NE(trees.status().message().find("trees[0]: tokens, parents"), std::string::npos)
      << trees.status();

  // Through the engine: the request completes with plain greedy output and counts the error.
  auto target = Target();
  ASSERT_TRUE(target->engine()
                  .AddDrafter(std::make_unique<target::RemoteDrafter>(
                      *connection, (*connection)->info().drafters(0)))
                  .ok());
  StepPlan plan = Admit(1, {5, 9, 13}, 8);
  plan.admit[0].request.speculation.drafter = "broken";
  const auto got = RunToEnd(*target, plan);
  ReferenceDecoder reference(dir_);
  EXPECT_EQ(got, reference.Greedy({5, 9, 13}, 8));
}

TEST_F(InternalServicesTest, TargetRejectsABrokenPlanNamingTheFieldAndFreesTheSession) {
  auto target = Target();
  target::TargetService service(target.get(), nullptr, 2s);
  auto server =
      services::ServiceServer::Start("127.0.0.1", 0, &service, v1::Target::service_full_name());
  ASSERT_TRUE(server.ok());
  auto stub = v1::Target::NewStub(
      grpc::CreateChannel(Address((*server)->port()), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    auto stream = stub->Run(&context);
    v1::StepPlan plan;
    v1::Admission* a = plan.add_admit();
    a->set_request_id(1);
    a->mutable_request()->add_prompt(5);
    a->mutable_request()->set_max_new_tokens(100);
    ASSERT_TRUE(stream->Write(plan));
    v1::StepResult result;
    ASSERT_TRUE(stream->Read(&result));  // admitted and prefilled
    ASSERT_EQ(result.updates_size(), 1);
    EXPECT_EQ(result.updates(0).new_tokens_size(), 1) << result.updates(0).error_message();
    plan.mutable_admit(0)->set_request_id(2);
    plan.mutable_admit(0)->mutable_request()->set_verify(static_cast<v1::VerifyMode>(99));
    ASSERT_TRUE(stream->Write(plan));
    EXPECT_FALSE(stream->Read(&result));
    grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find("admit[0].request.verify: unknown verification mode"),
              std::string::npos)
        << status.error_message();
  }
  EXPECT_EQ(service.num_requests(), 0) << "the ended session's requests still hold KV blocks";
  EXPECT_EQ(target->target().kv_stats().free_blocks, target->target().kv_stats().num_blocks);
  // A draft budget's prices out of range: the session ends with an error naming the field.
  auto refused = [&](double min_reach, double depth_reach, const std::string& want,
                     int32_t quiet_steps = 0) {
    grpc::ClientContext context;
    auto stream = stub->Run(&context);
    v1::StepPlan plan;
    v1::DraftBudget* b = plan.add_budgets();
    b->set_request_id(1);
    b->set_max_draft_tokens(2);
    b->set_min_reach(min_reach);
    b->set_depth_reach(depth_reach);
    b->set_quiet_steps(quiet_steps);
    ASSERT_TRUE(stream->Write(plan));
    v1::StepResult result;
    EXPECT_FALSE(stream->Read(&result));
    grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(status.error_message().find(want), std::string::npos) << status.error_message();
  };
  refused(2.0, 0, "budgets[0].min_reach must be in [0, 1], got 2");
  for (double bad : {-1.0, std::numeric_limits<double>::infinity()}) {
    refused(0, bad, "budgets[0].depth_reach must be finite and at least 0");
  }
  refused(0, 0, "budgets[0].quiet_steps must be at least 0, got -3", -3);
  // A new session works.
  grpc::ClientContext context;
  auto stream = stub->Run(&context);
  v1::StepPlan plan;
  v1::Admission* a = plan.add_admit();
  a->set_request_id(1);
  a->mutable_request()->add_prompt(5);
  a->mutable_request()->set_max_new_tokens(1);
  ASSERT_TRUE(stream->Write(plan));
  v1::StepResult result;
  ASSERT_TRUE(stream->Read(&result));
  ASSERT_EQ(result.updates_size(), 1);
  EXPECT_TRUE(result.updates(0).finished());
  EXPECT_EQ(result.updates(0).finish_reason(), "length");
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// Issue 19.9: the drafter service built any tree a peer asked for (a 2,000,000-node budget) and
// took observations past the context length.
TEST_F(InternalServicesTest, DrafterServiceRefusesBudgetsOverTheCapAndObservationsPastTheContext) {
  RawSession session(server_->port());
  v1::DrafterCall add;
  add.set_drafter("recording");
  add.mutable_add()->set_seq(7);
  ASSERT_EQ(session.Call(add).code(), 0);
  auto propose = [](int32_t nodes, int32_t depth, double min_reach = 0, double depth_reach = 0) {
    v1::DrafterCall call;
    call.set_drafter("recording");
    v1::DraftRequest* r = call.mutable_propose()->add_requests();
    r->set_seq(7);
    r->set_max_nodes(nodes);
    r->set_max_depth(depth);
    r->set_min_reach(min_reach);
    r->set_depth_reach(depth_reach);
    return call;
  };
  v1::DrafterReply reply = session.Call(propose(2000000, 4));
  EXPECT_EQ(reply.code(), 3) << reply.message();
  EXPECT_NE(reply.message().find("propose.requests[0].max_nodes must be in [0, 256], got 2000000"),
            std::string::npos)
      << reply.message();
  reply = session.Call(propose(4, 100000));
  EXPECT_EQ(reply.code(), 3) << reply.message();
  EXPECT_NE(reply.message().find("propose.requests[0].max_depth must be in [0, 256]"),
            std::string::npos)
      << reply.message();
  for (double bad : {-0.5, 1.5, std::nan("")}) {
    reply = session.Call(propose(4, 4, bad));
    EXPECT_EQ(reply.code(), 3) << reply.message();
    EXPECT_NE(reply.message().find("propose.requests[0].min_reach must be in [0, 1]"),
              std::string::npos)
        << reply.message();
  }
  for (double bad : {-0.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    reply = session.Call(propose(4, 4, 0, bad));
    EXPECT_EQ(reply.code(), 3) << reply.message();
    EXPECT_NE(reply.message().find("propose.requests[0].depth_reach must be finite and at least 0"),
              std::string::npos)
        << reply.message();
  }

  const int64_t context = config_.max_position_embeddings;
  const int64_t d = config_.hidden_size;
  auto observe = [&](int64_t tokens, int64_t rows) {
    v1::DrafterCall call;
    call.set_drafter("recording");
    v1::Observation* o = call.mutable_observe()->add_observations();
    o->set_seq(7);
    for (int64_t t = 0; t < tokens; ++t) o->add_tokens(static_cast<int32_t>(t % 50));
    for (int l = 0; l < 2; ++l) {
      EXPECT_TRUE(services::EncodeTensor(at::zeros({rows, d}), o->add_hidden()).ok());
    }
    return call;
  };
  reply = session.Call(observe(context + 1, context));
  EXPECT_EQ(reply.code(), 3) << reply.message();
  EXPECT_NE(reply.message().find("observe.observations[0].tokens: " + std::to_string(context + 1) +
                                 " tokens take sequence 7 to " + std::to_string(context + 1) +
                                 " tokens, past the context length of " + std::to_string(context)),
            std::string::npos)
      << reply.message();
  EXPECT_TRUE(remote_log_->tokens.empty()) << "a rejected call reached the drafter";
  // Up to the context is fine, one more token is not.
  ASSERT_EQ(session.Call(observe(context - 1, context - 2)).code(), 0);
  ASSERT_EQ(session.Call(observe(1, 1)).code(), 0);
  EXPECT_EQ(session.Call(observe(1, 1)).code(), 3);
  EXPECT_EQ(session.Call(propose(256, 256)).code(), 0);
}

// A drafter service whose proposals take `delay` (a slow or frozen drafter), and whose answers
// to releases can be held until the test lets them go (adds are refused with `refuse_adds`, and
// with `reject_unknown` a call naming a sequence not added is refused whole, as the real service
// does);
// other calls are answered at once. A
// proposal's trees tell the replies apart. With `observe_waits_for_next`, an Observe is answered
// only once the call after it has arrived (a client that waits for that answer before sending
// more hangs until its deadline); `seen` lists the kinds of calls in arrival order.
class SlowDrafterService final : public v1::Drafter::Service {
 public:
  grpc::Status GetDrafterInfo(grpc::ServerContext*, const v1::GetDrafterInfoRequest*,
                              v1::DrafterInfo* info) override {
    info->add_drafters()->set_name("slow");
    info->set_vocab_size(vocab);
    info->set_hidden_size(hidden);
    info->set_hidden_dtype(v1::DTYPE_FLOAT32);
    return grpc::Status::OK;
  }
  grpc::Status Session(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::DrafterReply, v1::DrafterCall>* stream) override {
    v1::DrafterCall call;
    std::set<int64_t> known;  // the sequences this session added
    bool have = stream->Read(&call);
    while (have) {
      v1::DrafterReply reply;
      {
        std::lock_guard<std::mutex> lock(seen_mu_);
        seen_.push_back(call.call_case());
      }
      if (call.has_observe() && observe_waits_for_next) {
        v1::DrafterCall next;
        have = stream->Read(&next);
        stream->Write(reply);
        call = std::move(next);
        continue;
      }
      if (call.has_release()) {
        std::unique_lock<std::mutex> lock(release_mu_);
        release_cv_.wait(lock, [&] { return !hold_releases_; });
      }
      if (call.has_add() && refuse_adds) {
        reply.set_code(static_cast<int32_t>(StatusCode::kResourceExhausted));
        reply.set_message("add: no room for the sequence");
      } else if (call.has_add()) {
        known.insert(call.add().seq());
      }
      if (call.has_release()) known.erase(call.release().seq());
      // As the real service: a call naming a sequence it does not have is refused whole.
      std::vector<int64_t> named;
      for (const v1::Observation& o : call.observe().observations()) named.push_back(o.seq());
      for (const v1::DraftRequest& r : call.propose().requests()) named.push_back(r.seq());
      const bool unknown = std::any_of(named.begin(), named.end(),
                                       [&](int64_t seq) { return known.count(seq) == 0; });
      if (reject_unknown && unknown) {
        reply.set_code(static_cast<int32_t>(StatusCode::kNotFound));
        reply.set_message("unknown sequence");
        stream->Write(reply);
        have = stream->Read(&call);
        continue;
      }
      if (call.has_propose()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms.load()));
        for (const v1::DraftRequest& r : call.propose().requests()) {
          v1::CandidateTree* t = reply.add_trees();
          t->add_tokens(static_cast<int32_t>(r.max_nodes()));  // tells the replies apart
          t->add_parents(-1);
          t->add_draft_probs(1.0f);
          t->add_proposals(-1);
        }
      }
      stream->Write(reply);
      have = stream->Read(&call);
    }
    return grpc::Status::OK;
  }
  std::vector<v1::DrafterCall::CallCase> seen() {
    std::lock_guard<std::mutex> lock(seen_mu_);
    return seen_;
  }
  void HoldReleases(bool hold) {
    {
      std::lock_guard<std::mutex> lock(release_mu_);
      hold_releases_ = hold;
    }
    release_cv_.notify_all();
  }
  int32_t vocab = 0;
  int32_t hidden = 0;
  std::atomic<int> delay_ms{0};
  std::atomic<bool> observe_waits_for_next{false};
  std::atomic<bool> refuse_adds{false};
  std::atomic<bool> reject_unknown{false};  // refuse an Observe or Propose naming one not added

 private:
  std::mutex seen_mu_;
  std::vector<v1::DrafterCall::CallCase> seen_;
  std::mutex release_mu_;
  std::condition_variable release_cv_;
  bool hold_releases_ = false;
};

// A SlowDrafterService served on a free port, and the target's connection to it.
struct SlowDrafterStack {
  SlowDrafterService service;
  std::unique_ptr<services::ServiceServer> server;
  std::shared_ptr<target::DrafterConnection> connection;
  std::unique_ptr<target::RemoteDrafter> drafter;  // "slow", on `connection`
};

// Starts `stack` for a target of `config`'s vocabulary and hidden size; its connection's calls
// get `deadline`.
void StartSlowDrafter(const ModelConfig& config, SlowDrafterStack& stack,
                      std::chrono::milliseconds deadline) {
  stack.service.vocab = static_cast<int32_t>(config.vocab_size);
  stack.service.hidden = static_cast<int32_t>(config.hidden_size);
  auto server = services::ServiceServer::Start("127.0.0.1", 0, &stack.service,
                                               v1::Drafter::service_full_name());
  ASSERT_TRUE(server.ok()) << server.status();
  stack.server = std::move(*server);
  auto connection = target::DrafterConnection::Connect(
      Address(stack.server->port()), 5s, stack.service.vocab, stack.service.hidden, "float32");
  ASSERT_TRUE(connection.ok()) << connection.status();
  stack.connection = std::move(*connection);
  stack.connection->set_call_deadline(deadline);
  stack.drafter = std::make_unique<target::RemoteDrafter>(stack.connection,
                                                          stack.connection->info().drafters(0));
}

// The trees of a SlowDrafterService's answer: one tree of one node, whose token tells which
// call it answered.
void ExpectAnswerOf(const StatusOr<std::vector<CandidateTree>>& trees, int32_t token,
                    const std::string& what) {
  ASSERT_TRUE(trees.ok()) << trees.status();
  ASSERT_EQ(trees->size(), 1u);
  ASSERT_EQ((*trees)[0].size(), 1);
  EXPECT_EQ((*trees)[0].token(0), token) << what;
}

// A release is sent, not waited for: the engine thread spends no round trip on a finished
// request. Its answer, when it comes, is dropped, and the next call still gets its own answer on
// the same stream.
TEST_F(InternalServicesTest, ReleasesAreNotWaitedFor) {
  SlowDrafterStack stack;
  ASSERT_NO_FATAL_FAILURE(StartSlowDrafter(config_, stack, 60s));
  SlowDrafterService& slow = stack.service;
  const std::shared_ptr<target::DrafterConnection>& connection = stack.connection;
  target::RemoteDrafter& drafter = *stack.drafter;
  ASSERT_TRUE(drafter.AddSequence(41, {}).ok());
  ASSERT_TRUE(drafter.AddSequence(42, {}).ok());
  // Their adds go out with their first draft.
  ASSERT_TRUE(drafter
                  .Propose({{.seq = 41, .max_nodes = 1, .max_depth = 1},
                            {.seq = 42, .max_nodes = 1, .max_depth = 1}})
                  .ok());
  const uint64_t session = connection->session();
  slow.HoldReleases(true);
  const auto start = std::chrono::steady_clock::now();
  drafter.ReleaseSequence(41);
  // The service holds the answer; waiting for it would take the whole 60 s call deadline.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  slow.HoldReleases(false);
  auto next = drafter.Propose({{.seq = 42, .max_nodes = 5, .max_depth = 1}});
  ASSERT_NO_FATAL_FAILURE(ExpectAnswerOf(next, 5, "got the release's answer"));
  EXPECT_EQ(connection->session(), session) << "the stream was dropped";
  EXPECT_EQ(drafter.Propose({{.seq = 41, .max_nodes = 2, .max_depth = 1}}).status().code(),
            StatusCode::kNotFound);
  // Released on a stream that is gone: nothing is sent, nothing waits.
  stack.server.reset();
  drafter.ReleaseSequence(42);
}

// An add goes out with the sequence's first draft, in its round trip: the step that admits a
// request (and prefills its prompt, the longest gap its neighbours' streams see) sends nothing,
// and a sequence that never drafts (most of them at large batches) costs the service, the stream
// and the engine thread nothing, its release included. A refused add costs that sequence alone
// its drafts.
TEST_F(InternalServicesTest, AddsGoOutWithTheFirstDraft) {
  SlowDrafterStack stack;
  ASSERT_NO_FATAL_FAILURE(StartSlowDrafter(config_, stack, 60s));
  SlowDrafterService& slow = stack.service;
  const std::shared_ptr<target::DrafterConnection>& connection = stack.connection;
  target::RemoteDrafter& drafter = *stack.drafter;
  const uint64_t session = connection->session() + 1;  // the first call opens the stream
  using Case = v1::DrafterCall::CallCase;
  ASSERT_TRUE(drafter.AddSequence(40, {}).ok());
  drafter.ReleaseSequence(40);  // never drafted: nothing was sent, nothing is
  ASSERT_TRUE(drafter.AddSequence(41, {}).ok());
  EXPECT_TRUE(slow.seen().empty()) << "an add went out before a draft";
  EXPECT_EQ(drafter.AddSequence(41, {}).code(), StatusCode::kAlreadyExists) << "known here";
  auto first = drafter.Propose({{.seq = 41, .max_nodes = 3, .max_depth = 1}});
  ASSERT_NO_FATAL_FAILURE(ExpectAnswerOf(first, 3, "got the add's answer"));
  EXPECT_EQ(slow.seen(), (std::vector<Case>{Case::kAdd, Case::kPropose}));

  slow.refuse_adds = true;
  ASSERT_TRUE(drafter.AddSequence(43, {}).ok()) << "refused later, at its first draft";
  auto refused = drafter.Propose({{.seq = 43, .max_nodes = 2, .max_depth = 1}});
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ((*refused)[0].failure().code(), StatusCode::kResourceExhausted);
  slow.refuse_adds = false;  // only now: the service read the add when it answered
  ASSERT_TRUE(drafter.AddSequence(44, {}).ok());
  EXPECT_EQ(drafter.AddSequence(44, {}).code(), StatusCode::kAlreadyExists) << "known here";
  auto both = drafter.Propose({{.seq = 43, .max_nodes = 2, .max_depth = 1},
                               {.seq = 44, .max_nodes = 4, .max_depth = 1},
                               {.seq = 41, .max_nodes = 5, .max_depth = 1}});
  ASSERT_TRUE(both.ok()) << both.status();
  ASSERT_EQ(both->size(), 3u);
  EXPECT_EQ((*both)[0].failure().code(), StatusCode::kResourceExhausted) << (*both)[0].failure();
  EXPECT_NE((*both)[0].failure().message().find("no room"), std::string::npos);
  ASSERT_EQ((*both)[1].size(), 1);
  EXPECT_EQ((*both)[1].token(0), 4) << "the neighbours draft as usual";
  ASSERT_EQ((*both)[2].size(), 1);
  EXPECT_EQ((*both)[2].token(0), 5);
  // The refused sequence's observations are not sent (the service does not know it).
  Status observed = drafter.Observe({{.seq = 43, .tokens = {5}}, {.seq = 44, .tokens = {6}}});
  EXPECT_TRUE(observed.ok()) << observed;
  EXPECT_EQ(connection->session(), session) << "the stream was dropped";
  // Re-added after a release (a drafter restarted from recent tokens): the release goes now, the
  // add with the next draft.
  drafter.ReleaseSequence(44);
  ASSERT_TRUE(drafter.AddSequence(44, {}).ok());
  ASSERT_NO_FATAL_FAILURE(
      ExpectAnswerOf(drafter.Propose({{.seq = 44, .max_nodes = 6, .max_depth = 1}}), 6,
                     "an add's or release's answer"));
  const std::vector<Case> seen = slow.seen();
  ASSERT_GE(seen.size(), 3u);
  EXPECT_EQ((std::vector<Case>(seen.end() - 3, seen.end())),
            (std::vector<Case>{Case::kRelease, Case::kAdd, Case::kPropose}));
  EXPECT_EQ(connection->session(), session);
}

// A refused add in a batch: the service refuses the whole Observe or Propose that names its
// sequence (and applies nothing of it), so what was not applied goes again without it, once: the
// neighbours observe once and draft as usual, the refused sequence alone gets a Failed tree.
TEST_F(InternalServicesTest, ARefusedAddInABatchCostsOnlyItsSequence) {
  SlowDrafterStack stack;
  ASSERT_NO_FATAL_FAILURE(StartSlowDrafter(config_, stack, 60s));
  SlowDrafterService& slow = stack.service;
  target::RemoteDrafter& drafter = *stack.drafter;
  using Case = v1::DrafterCall::CallCase;
  slow.reject_unknown = true;
  ASSERT_TRUE(drafter.AddSequence(44, {}).ok());
  ASSERT_NO_FATAL_FAILURE(ExpectAnswerOf(
      drafter.Propose({{.seq = 44, .max_nodes = 1, .max_depth = 1}}), 1, "44 is added"));
  slow.refuse_adds = true;
  ASSERT_TRUE(drafter.AddSequence(43, {}).ok());
  const size_t before = slow.seen().size();
  // The Observe names 43 and is refused whole; it and the Propose go again without 43.
  Status observed;
  auto trees = drafter.ObserveAndPropose(
      {{.seq = 43, .tokens = {5}}, {.seq = 44, .tokens = {6}}},
      {{.seq = 43, .max_nodes = 2, .max_depth = 1}, {.seq = 44, .max_nodes = 4, .max_depth = 1}},
      &observed);
  ASSERT_TRUE(observed.ok()) << observed;
  ASSERT_TRUE(trees.ok()) << trees.status();
  ASSERT_EQ(trees->size(), 2u);
  EXPECT_EQ((*trees)[0].failure().code(), StatusCode::kResourceExhausted) << (*trees)[0].failure();
  ASSERT_EQ((*trees)[1].size(), 1);
  EXPECT_EQ((*trees)[1].token(0), 4);
  std::vector<Case> seen = slow.seen();
  EXPECT_EQ((std::vector<Case>(seen.begin() + static_cast<std::ptrdiff_t>(before), seen.end())),
            (std::vector<Case>{Case::kAdd, Case::kObserve, Case::kPropose, Case::kObserve,
                               Case::kPropose}));
  // Observed in the first batch, refused in its Propose only: the Observe is not sent again.
  slow.refuse_adds = true;
  ASSERT_TRUE(drafter.AddSequence(45, {}).ok());
  const size_t mid = slow.seen().size();
  trees = drafter.ObserveAndPropose(
      {{.seq = 44, .tokens = {7}}},
      {{.seq = 45, .max_nodes = 2, .max_depth = 1}, {.seq = 44, .max_nodes = 3, .max_depth = 1}},
      &observed);
  ASSERT_TRUE(observed.ok()) << observed;
  ASSERT_TRUE(trees.ok()) << trees.status();
  EXPECT_EQ((*trees)[0].failure().code(), StatusCode::kResourceExhausted);
  ASSERT_EQ((*trees)[1].size(), 1);
  EXPECT_EQ((*trees)[1].token(0), 3);
  seen = slow.seen();
  EXPECT_EQ((std::vector<Case>(seen.begin() + static_cast<std::ptrdiff_t>(mid), seen.end())),
            (std::vector<Case>{Case::kAdd, Case::kObserve, Case::kPropose, Case::kPropose}));
}

// A drafted step costs the target one round trip: its catch-up Observe and its Propose are both
// on the stream before it waits for either answer. This service answers an Observe only after
// the next call has arrived, so a target that waited in between would hang until the deadline.
TEST_F(InternalServicesTest, ObserveAndProposeShareOneRoundTrip) {
  SlowDrafterStack stack;
  ASSERT_NO_FATAL_FAILURE(StartSlowDrafter(config_, stack, 30s));
  SlowDrafterService& slow = stack.service;
  const std::shared_ptr<target::DrafterConnection>& connection = stack.connection;
  target::RemoteDrafter& drafter = *stack.drafter;
  ASSERT_TRUE(drafter.AddSequence(42, {}).ok());
  slow.observe_waits_for_next = true;
  Status observed;
  auto trees = drafter.ObserveAndPropose({{.seq = 42, .tokens = {5, 9, 13}}},
                                         {{.seq = 42, .max_nodes = 4, .max_depth = 2}}, &observed);
  ASSERT_TRUE(observed.ok()) << observed;
  ASSERT_NO_FATAL_FAILURE(ExpectAnswerOf(trees, 4, "not the Propose's own answer"));
  using Case = v1::DrafterCall::CallCase;
  EXPECT_EQ(slow.seen(), (std::vector<Case>{Case::kAdd, Case::kObserve, Case::kPropose}));

  // Through the engine: every drafted step of a request goes out this way.
  auto target = Target();
  ASSERT_TRUE(target->engine()
                  .AddDrafter(std::make_unique<target::RemoteDrafter>(
                      connection, connection->info().drafters(0)))
                  .ok());
  StepPlan plan = Admit(1, {5, 9, 13}, 6);
  plan.admit[0].request.speculation.drafter = "slow";
  plan.admit[0].request.speculation.max_draft_tokens = 2;
  std::vector<int32_t> tokens;
  int64_t draft_steps = 0;
  bool done = false;
  for (int step = 0; step < 100 && !done; ++step) {
    auto out = target->Step(plan);
    ASSERT_TRUE(out.ok()) << out.status();
    plan = {};
    for (const RequestUpdate& u : out->report.updates) {
      tokens.insert(tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.finished) {
        done = true;
        draft_steps = u.stats.draft_steps;
        EXPECT_EQ(u.stats.draft_errors, 0) << u.stats.last_draft_error;
      }
    }
  }
  ASSERT_TRUE(done);
  ReferenceDecoder reference(dir_);
  EXPECT_EQ(tokens, reference.Greedy({5, 9, 13}, 6));
  EXPECT_GT(draft_steps, 0);
}

// Issue 19.3: a slow drafter stalled the target's every step. A call past the deadline fails alone
// (DEADLINE_EXCEEDED), its late answer is dropped, and the next call gets its own answer on the
// same stream; through the engine, a request completes with plain greedy output and counts the
// draft errors.
TEST_F(InternalServicesTest, SlowDrafterCostsOnlyThatStepsSpeculation) {
  SlowDrafterStack stack;
  ASSERT_NO_FATAL_FAILURE(StartSlowDrafter(config_, stack, 300ms));
  SlowDrafterService& slow = stack.service;
  const std::shared_ptr<target::DrafterConnection>& connection = stack.connection;
  target::RemoteDrafter& drafter = *stack.drafter;
  ASSERT_TRUE(drafter.AddSequence(42, {}).ok());
  ASSERT_TRUE(drafter.Propose({{.seq = 42, .max_nodes = 1, .max_depth = 1}}).ok());  // the add
  const uint64_t session = connection->session();
  slow.delay_ms = 1500;
  auto late = drafter.Propose({{.seq = 42, .max_nodes = 3, .max_depth = 1}});
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), StatusCode::kDeadlineExceeded) << late.status();
  EXPECT_NE(late.status().message().find("--drafter-deadline-ms"), std::string::npos)
      << late.status();
  slow.delay_ms = 0;
  // Generous: this call first waits behind the late one on the service.
  connection->set_call_deadline(20s);
  auto next = drafter.Propose({{.seq = 42, .max_nodes = 5, .max_depth = 1}});
  ASSERT_NO_FATAL_FAILURE(ExpectAnswerOf(next, 5, "got the late answer of the earlier call"));
  EXPECT_EQ(connection->session(), session) << "the stream was dropped";

  // Through the engine: every proposal is late.
  connection->set_call_deadline(200ms);
  slow.delay_ms = 1000;
  auto target = Target();
  ASSERT_TRUE(target->engine()
                  .AddDrafter(std::make_unique<target::RemoteDrafter>(
                      connection, connection->info().drafters(0)))
                  .ok());
  StepPlan plan = Admit(1, {5, 9, 13}, 6);
  plan.admit[0].request.speculation.drafter = "slow";
  std::vector<int32_t> tokens;
  int64_t draft_errors = 0;
  for (int step = 0; step < 100; ++step) {
    auto out = target->Step(plan);
    ASSERT_TRUE(out.ok()) << out.status();
    plan = {};
    bool done = false;
    for (const RequestUpdate& u : out->report.updates) {
      tokens.insert(tokens.end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.finished) {
        done = true;
        draft_errors = u.stats.draft_errors;
      }
    }
    if (done) break;
  }
  slow.delay_ms = 0;
  ReferenceDecoder reference(dir_);
  EXPECT_EQ(tokens, reference.Greedy({5, 9, 13}, 6));
  EXPECT_GT(draft_errors, 0);
}

// Issue 19.5: after a drafter restart the sequences of the old session silently got empty trees:
// no speculation and no draft error. Each such step is now a draft error of that sequence alone,
// while a sequence added after the restart speculates.
TEST_F(InternalServicesTest, SequencesThatLostTheirDrafterCountDraftErrorsEveryStep) {
  auto connection = target::DrafterConnection::Connect(
      Address(server_->port()), 5s, static_cast<int32_t>(config_.vocab_size),
      static_cast<int32_t>(config_.hidden_size), "float32");
  ASSERT_TRUE(connection.ok()) << connection.status();
  auto target = Target();
  ASSERT_TRUE(target->engine()
                  .AddDrafter(std::make_unique<target::RemoteDrafter>(
                      *connection, (*connection)->info().drafters(0)))
                  .ok());
  std::map<RequestId, RequestUpdate> last;
  auto step = [&](const StepPlan& plan) {
    auto out = target->Step(plan);
    ASSERT_TRUE(out.ok()) << out.status();
    for (const RequestUpdate& u : out->report.updates) last[u.id] = u;
  };
  step(Admit(1, {5, 9, 13, 2}, 40));
  step({});
  step({});
  // The drafter service restarts on the same port: the old session and its state are gone.
  const int port = server_->port();
  server_.reset();
  auto restarted = services::ServiceServer::Start("127.0.0.1", port, service_.get(),
                                                  v1::Drafter::service_full_name());
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  server_ = std::move(*restarted);
  // The connection moves to a new session. Left to the next step, whether that step's call found
  // the old stream already closed (sequence 1 then fails every step) or wrote to it first (the
  // failed call detaches sequence 1: one error) was a race the loaded machine sometimes lost.
  v1::DrafterCall sync;
  sync.set_drafter((*connection)->info().drafters(0).name());
  sync.mutable_propose();
  uint64_t session = 0;
  bool reconnected = false;
  for (int attempt = 0; attempt < 3 && !reconnected; ++attempt) {
    reconnected = (*connection)->Call(sync, &session).ok();
  }
  ASSERT_TRUE(reconnected);
  step({});                       // sequence 1's state is gone: a draft error
  step(Admit(2, {7, 3, 8}, 12));  // the new sequence is known to the new session
  for (int i = 0; i < 60 && !(last[1].finished && last[2].finished); ++i) step({});
  ASSERT_TRUE(last[1].finished && last[2].finished);
  ReferenceDecoder reference(dir_);
  EXPECT_GT(last[1].stats.draft_errors, 5) << "steps without a draft went uncounted";
  EXPECT_EQ(last[2].stats.draft_errors, 0) << last[2].stats.last_draft_error;
  EXPECT_GT(last[2].stats.draft_steps, 0);
}

}  // namespace
}  // namespace specula
