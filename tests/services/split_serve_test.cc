// Black-box tests of the three-process deployment: `specula serve --role drafter`, `--role target
// --drafter-address` and `--role router --target-address`, real processes on 127.0.0.1 with free
// ports, compared with the all-in-one `--role all` and with plain greedy decoding.
//   - Served greedy output equals plain decoding for every drafter, with 32 concurrent streaming
//     clients of different prompt lengths and max_new_tokens, in both deployments.
//   - A request past its deadline ends with DEADLINE_EXCEEDED and frees its KV blocks in the
//     target while the others complete.
//   - The drafter process killed mid-run: in-flight requests finish with correct output without
//     speculation; a restarted drafter serves new requests again. The target killed: requests fail
//     with UNAVAILABLE, none hang.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "specula/v1/generation.grpc.pb.h"
#include "tests/services/http_get.h"
#include "tests/services/served_test_model.h"
#include "tests/services/server_process.h"

namespace specula {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<grpc::Channel> Channel(int port) {
  return grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                             grpc::InsecureChannelCredentials());
}

std::string Address(const ServerProcess& p) { return "127.0.0.1:" + std::to_string(p.port()); }

// The drafter, target and router processes (or one `--role all` process).
class Deployment {
 public:
  bool StartAll(const TestModelDirs& dirs) {
    // Fixed draft budgets: these tests check that speculation runs (and fails over), whatever the
    // adaptive policy would conclude on a loaded machine.
    return router_.Start({"--role", "all", "--model", dirs.target, "--drafter", "ngram,draft-model",
                          "--drafter-model", dirs.draft, "--port", "0", "--metrics-port", "0",
                          "--draft-budget", "fixed"});
  }
  // The drafter deadline is generous by default: these tests assert draft_errors == 0 on machines
  // that may be loaded (or pause a process for a moment). The target runs `target_drafters`
  // itself; by default none, so that every drafter, n-gram too, goes through the drafter service.
  bool StartSplit(const TestModelDirs& dirs, const std::string& drafter_deadline_ms = "20000",
                  const std::string& target_step_deadline_s = "60",
                  const std::string& target_drafters = "none") {
    dirs_ = dirs;
    if (!StartDrafter("0")) return false;
    if (!target_.Start({"--role", "target", "--model", dirs.target, "--drafter-address",
                        Address(drafter_), "--drafter", target_drafters, "--port", "0",
                        "--metrics-port", "-1", "--drafter-deadline-ms", drafter_deadline_ms})) {
      error_ = target_.error();
      return false;
    }
    if (!router_.Start({"--role", "router", "--model", dirs.target, "--target-address",
                        Address(target_), "--port", "0", "--metrics-port", "0", "--default-drafter",
                        "ngram", "--target-step-deadline-s", target_step_deadline_s,
                        "--draft-budget", "fixed"})) {
      error_ = router_.error();
      return false;
    }
    return true;
  }
  bool StartDrafter(const std::string& port) {
    if (!drafter_.Start({"--role", "drafter", "--model", dirs_.target, "--drafter",
                         "ngram,draft-model", "--drafter-model", dirs_.draft, "--port", port,
                         "--metrics-port", "-1"})) {
      error_ = drafter_.error();
      return false;
    }
    return true;
  }
  std::string error() const { return error_.empty() ? router_.error() : error_; }

  ServerProcess& router() { return router_; }
  ServerProcess& target() { return target_; }
  ServerProcess& drafter() { return drafter_; }

 private:
  TestModelDirs dirs_;
  std::string error_;
  ServerProcess drafter_;
  ServerProcess target_;
  ServerProcess router_;
};

struct Streamed {
  grpc::Status status;
  std::vector<int32_t> ids;
  v1::GenerationFinished finished;
};

Streamed Stream(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                std::chrono::milliseconds timeout = 120s) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  auto reader = stub.GenerateStream(&context, request);
  Streamed out;
  v1::GenerateStreamResponse message;
  while (reader->Read(&message)) {
    if (message.has_delta()) {
      out.ids.insert(out.ids.end(), message.delta().token_ids().begin(),
                     message.delta().token_ids().end());
    }
    if (message.has_finished()) out.finished = message.finished();
  }
  out.status = reader->Finish();
  return out;
}

v1::GenerateRequest GreedyRequest(const std::vector<int32_t>& prompt, int32_t max_new,
                                  const std::string& drafter) {
  v1::GenerateRequest r;
  for (int32_t t : prompt) r.mutable_token_ids()->add_ids(t);
  r.set_max_new_tokens(max_new);
  r.set_ignore_eos(true);
  r.mutable_speculation()->set_drafter(drafter);
  r.mutable_speculation()->set_max_draft_tokens(4);
  return r;
}

// Prompt i of a fixed family: different lengths and contents.
std::vector<int32_t> Prompt(const Tokenizer& tok, int i) {
  std::string text = "def f" + std::to_string(i) + "(x):\n";
  for (int k = 0; k < i % 7; ++k) text += "    y = x + " + std::to_string(k) + "\n";
  text += "    return";
  return tok.Encode(text);
}

class DeploymentTest : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { reference_ = new ReferenceDecoder(TinyServedModelDirs().target); }
  static void TearDownTestSuite() {
    delete reference_;
    reference_ = nullptr;
  }
  bool Start(Deployment& d) {
    return GetParam() == "all" ? d.StartAll(TinyServedModelDirs())
                               : d.StartSplit(TinyServedModelDirs());
  }
  static ReferenceDecoder* reference_;
};

ReferenceDecoder* DeploymentTest::reference_ = nullptr;

TEST_P(DeploymentTest, ConcurrentStreamingClientsGetPlainGreedyOutputForEveryDrafter) {
  Deployment d;
  ASSERT_TRUE(Start(d)) << d.error();
  auto stub = v1::Generation::NewStub(Channel(d.router().port()));
  const std::vector<std::string> drafters = {"none", "ngram", "draft-model"};
  constexpr int kClients = 32;
  std::vector<Streamed> got(kClients);
  std::vector<std::vector<int32_t>> prompts(kClients);
  std::vector<int32_t> max_new(kClients);
  for (int i = 0; i < kClients; ++i) {
    prompts[i] = Prompt(reference_->tokenizer(), i);
    max_new[i] = 6 + (i * 5) % 23;
  }
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back(
        [&, i] { got[i] = Stream(*stub, GreedyRequest(prompts[i], max_new[i], drafters[i % 3])); });
  }
  for (auto& t : clients) t.join();
  int64_t accepted = 0;
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message();
    EXPECT_EQ(got[i].ids, reference_->Greedy(prompts[i], max_new[i]))
        << "client " << i << " drafter " << drafters[i % 3];
    EXPECT_EQ(got[i].finished.finish_reason(), v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(got[i].finished.spec().draft_errors(), 0) << i;
    accepted += got[i].finished.spec().accepted_tokens();
  }
  EXPECT_GT(accepted, 0) << "no draft token was ever accepted: is speculation running?";
  if (GetParam() == "split") {  // each server exposes its own metrics
    HttpResponse target = HttpGet(d.target().metrics_port(), "/metrics");
    ASSERT_EQ(target.status, 200);
    EXPECT_NE(target.body.find("specula_target_steps_total "), std::string::npos);
    EXPECT_EQ(target.body.find("specula_target_steps_total 0\n"), std::string::npos);
    HttpResponse drafter = HttpGet(d.drafter().metrics_port(), "/metrics");
    ASSERT_EQ(drafter.status, 200);
    EXPECT_NE(drafter.body.find("specula_drafter_calls_total{call=\"propose\",code=\"OK\","
                                "drafter=\"ngram\"}"),
              std::string::npos)
        << drafter.body;
  }
}

TEST_P(DeploymentTest, ExpiredRequestFreesItsKvBlocksWithoutDisturbingOthers) {
  Deployment d;
  ASSERT_TRUE(Start(d)) << d.error();
  auto stub = v1::Generation::NewStub(Channel(d.router().port()));
  const std::vector<int32_t> prompt = Prompt(reference_->tokenizer(), 3);
  Streamed expired, other;
  std::thread a([&] { expired = Stream(*stub, GreedyRequest(prompt, 900, "none"), 40ms); });
  std::thread b([&] { other = Stream(*stub, GreedyRequest(prompt, 40, "draft-model")); });
  a.join();
  b.join();
  EXPECT_EQ(expired.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << expired.status.error_message();
  ASSERT_TRUE(other.status.ok()) << other.status.error_message();
  EXPECT_EQ(other.ids, reference_->Greedy(prompt, 40));
  // Every block comes back once nothing runs.
  int64_t used = -1;
  for (int i = 0; i < 100 && used != 0; ++i) {
    grpc::ClientContext context;
    v1::ServerInfo info;
    ASSERT_TRUE(stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
    used = info.load().kv_cache_blocks_used() + info.load().running();
    if (used != 0) std::this_thread::sleep_for(50ms);
  }
  EXPECT_EQ(used, 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, DeploymentTest, ::testing::Values("all", "split"),
                         [](const auto& info) { return info.param; });

// SpecFormer, Beagle and ParallelSpec need the target's hidden states: across processes they
// travel target -> drafter as tensors. On the bundled model all must match plain decoding and
// accept drafts.
TEST_F(DeploymentTest, HiddenStateDraftersAcrossProcessesStayLossless) {
  const std::string root = SPECULA_SOURCE_DIR;
  const std::string model = root + "/models/pyllama-6m";
  ServerProcess drafter, target, router;
  ASSERT_TRUE(drafter.Start(
      {"--role", "drafter", "--model", model, "--drafter", "specformer,beagle,parallelspec",
       "--specformer-model", root + "/models/specformer-pyllama-6m", "--beagle-model",
       root + "/models/beagle-pyllama-6m", "--parallelspec-model",
       root + "/models/parallelspec-pyllama-6m", "--port", "0", "--metrics-port", "0"}))
      << drafter.error();
  ASSERT_TRUE(
      target.Start({"--role", "target", "--model", model, "--drafter-address", Address(drafter),
                    "--port", "0", "--metrics-port", "0", "--drafter-deadline-ms", "20000"}))
      << target.error();
  ASSERT_TRUE(
      router.Start({"--role", "router", "--model", model, "--target-address", Address(target),
                    "--port", "0", "--metrics-port", "0", "--draft-budget", "fixed"}))
      << router.error();
  EXPECT_NE(router.line().find("specformer"), std::string::npos) << router.line();
  EXPECT_NE(router.line().find("beagle"), std::string::npos) << router.line();
  EXPECT_NE(router.line().find("parallelspec"), std::string::npos) << router.line();
  ReferenceDecoder reference(model);
  auto stub = v1::Generation::NewStub(Channel(router.port()));
  const std::vector<std::string> texts = {"import os\n\ndef main(", "class Parser:\n    def ",
                                          "for i in range(10):\n    "};
  for (const std::string name : {"specformer", "beagle", "parallelspec"}) {
    std::vector<Streamed> got(texts.size());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < texts.size(); ++i) {
      clients.emplace_back([&, i] {
        got[i] = Stream(*stub, GreedyRequest(reference.tokenizer().Encode(texts[i]), 40, name));
      });
    }
    for (auto& t : clients) t.join();
    int64_t accepted = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      ASSERT_TRUE(got[i].status.ok()) << name << ": " << got[i].status.error_message();
      EXPECT_EQ(got[i].ids, reference.Greedy(reference.tokenizer().Encode(texts[i]), 40))
          << name << " " << i;
      EXPECT_EQ(got[i].finished.spec().draft_errors(), 0) << name << " " << i;
      accepted += got[i].finished.spec().accepted_tokens();
    }
    EXPECT_GT(accepted, 20) << name << " accepted almost nothing: are its hidden states right?";
  }
}

class SplitFailureTest : public DeploymentTest {};

TEST_F(SplitFailureTest, DrafterDeathDegradesToNoSpeculationAndRestartResumesIt) {
  Deployment d;
  ASSERT_TRUE(d.StartSplit(TinyServedModelDirs())) << d.error();
  auto stub = v1::Generation::NewStub(Channel(d.router().port()));
  const int drafter_port = d.drafter().port();
  constexpr int kClients = 6;
  std::vector<Streamed> got(kClients);
  std::vector<std::vector<int32_t>> prompts(kClients);
  std::atomic<int> started{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    prompts[i] = Prompt(reference_->tokenizer(), i);
    clients.emplace_back([&, i] {
      ++started;
      got[i] = Stream(*stub, GreedyRequest(prompts[i], 600, i % 2 ? "draft-model" : "ngram"));
    });
  }
  while (started < kClients) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(50ms);  // mid-run (a kill before the first draft counts too)
  d.drafter().Stop(SIGKILL);
  for (auto& t : clients) t.join();
  int64_t errors = 0;
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message();
    EXPECT_EQ(got[i].ids, reference_->Greedy(prompts[i], 600)) << "client " << i;
    errors += got[i].finished.spec().draft_errors();
  }
  EXPECT_GT(errors, 0) << "the drafter's death went unnoticed";

  // While it is down, new requests still work (without speculation).
  Streamed down = Stream(*stub, GreedyRequest(prompts[1], 20, "draft-model"));
  ASSERT_TRUE(down.status.ok()) << down.status.error_message();
  EXPECT_EQ(down.ids, reference_->Greedy(prompts[1], 20));
  EXPECT_EQ(down.finished.spec().draft_steps(), 0);

  ASSERT_TRUE(d.StartDrafter(std::to_string(drafter_port))) << d.error();
  Streamed again;
  for (int attempt = 0; attempt < 50; ++attempt) {  // the target reconnects on its next call
    again = Stream(*stub, GreedyRequest(prompts[2], 30, "draft-model"));
    ASSERT_TRUE(again.status.ok()) << again.status.error_message();
    if (again.finished.spec().draft_steps() > 0) break;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(again.ids, reference_->Greedy(prompts[2], 30));
  EXPECT_GT(again.finished.spec().draft_steps(), 0) << "speculation did not resume";
  EXPECT_EQ(again.finished.spec().draft_errors(), 0);
}

TEST_F(SplitFailureTest, TargetDeathFailsRequestsWithUnavailableAndNoneHang) {
  Deployment d;
  ASSERT_TRUE(d.StartSplit(TinyServedModelDirs())) << d.error();
  auto stub = v1::Generation::NewStub(Channel(d.router().port()));
  constexpr int kClients = 4;
  std::vector<Streamed> got(kClients);
  std::atomic<int> started{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      ++started;
      got[i] = Stream(*stub, GreedyRequest(Prompt(reference_->tokenizer(), i), 950, "none"), 60s);
    });
  }
  while (started < kClients) std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(50ms);
  const auto killed = std::chrono::steady_clock::now();
  d.target().Stop(SIGKILL);
  for (auto& t : clients) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 20s);
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(got[i].status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << i << ": " << got[i].status.error_message();
  }
  // New requests are refused the same way, promptly.
  Streamed after = Stream(*stub, GreedyRequest({5, 6}, 4, "none"), 20s);
  EXPECT_EQ(after.status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << after.status.error_message();
}

// Issue 19.3: a frozen drafter (SIGSTOP) stalled the whole target. With a call deadline it costs
// only speculation: every request completes with plain greedy output and counts draft errors.
TEST_F(SplitFailureTest, FrozenDrafterCostsOnlySpeculation) {
  Deployment d;
  ASSERT_TRUE(d.StartSplit(TinyServedModelDirs(), /*drafter_deadline_ms=*/"300")) << d.error();
  auto stub = v1::Generation::NewStub(Channel(d.router().port()));
  ASSERT_TRUE(d.drafter().Freeze()) << "the drafter did not stop";
  constexpr int kClients = 3;
  std::vector<Streamed> got(kClients);
  std::vector<std::vector<int32_t>> prompts(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    prompts[i] = Prompt(reference_->tokenizer(), i);
    clients.emplace_back([&, i] {
      got[i] = Stream(*stub, GreedyRequest(prompts[i], 12, i % 2 ? "draft-model" : "ngram"), 90s);
    });
  }
  for (auto& t : clients) t.join();
  d.drafter().Signal(SIGCONT);
  for (int i = 0; i < kClients; ++i) {
    ASSERT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message();
    EXPECT_EQ(got[i].ids, reference_->Greedy(prompts[i], 12)) << "client " << i;
    EXPECT_GT(got[i].finished.spec().draft_errors(), 0) << "client " << i;
  }
}

// n-gram lookup runs in the target process (serve's default --drafter) even with a drafter
// service: its drafts never wait for the service, so a frozen service costs the requests that use
// it their speculation and n-gram's nothing.
TEST_F(SplitFailureTest, NgramRunsInTheTargetAndNeverWaitsForTheDrafterService) {
  Deployment d;
  ASSERT_TRUE(d.StartSplit(TinyServedModelDirs(), /*drafter_deadline_ms=*/"300",
                           /*target_step_deadline_s=*/"60", /*target_drafters=*/"ngram"))
      << d.error();
  EXPECT_NE(d.target().line().find("drafters ngram (local), draft-model at "), std::string::npos)
      << d.target().line();
  auto stub = v1::Generation::NewStub(Channel(d.router().port()));
  ASSERT_TRUE(d.drafter().Freeze()) << "the drafter did not stop";
  const std::vector<int32_t> prompt = Prompt(reference_->tokenizer(), 3);
  // A repetitive prompt, so that the lookup finds matches and drafts.
  std::vector<int32_t> repeated;
  for (int i = 0; i < 4; ++i) repeated.insert(repeated.end(), prompt.begin(), prompt.end());
  Streamed ngram = Stream(*stub, GreedyRequest(repeated, 24, "ngram"), 90s);
  Streamed learned = Stream(*stub, GreedyRequest(prompt, 6, "draft-model"), 90s);
  d.drafter().Signal(SIGCONT);
  ASSERT_TRUE(ngram.status.ok()) << ngram.status.error_message();
  EXPECT_EQ(ngram.ids, reference_->Greedy(repeated, 24));
  EXPECT_GT(ngram.finished.spec().draft_steps(), 0) << "n-gram did not draft";
  EXPECT_EQ(ngram.finished.spec().draft_errors(), 0) << "n-gram waited for the drafter service";
  ASSERT_TRUE(learned.status.ok()) << learned.status.error_message();
  EXPECT_EQ(learned.ids, reference_->Greedy(prompt, 6));
  EXPECT_GT(learned.finished.spec().draft_errors(), 0) << "the service's drafter was not remote";
}

// Issue 19.3: a hung target froze the router's loop, and with it every client's cancellation. With
// a step deadline the requests fail with DEADLINE_EXCEEDED from the router itself.
TEST_F(SplitFailureTest, HungTargetFailsRequestsAtTheStepDeadline) {
  Deployment d;
  ASSERT_TRUE(d.StartSplit(TinyServedModelDirs(), "20000", /*target_step_deadline_s=*/"1"))
      << d.error();
  auto stub = v1::Generation::NewStub(Channel(d.router().port()));
  Streamed warm = Stream(*stub, GreedyRequest({5, 6}, 2, "none"));
  ASSERT_TRUE(warm.status.ok()) << warm.status.error_message();
  ASSERT_TRUE(d.target().Freeze()) << "the target did not stop";
  // The client's own deadline is far away: the error must come from the router.
  Streamed hung = Stream(*stub, GreedyRequest({5, 6, 7}, 8, "none"), 120s);
  d.target().Signal(SIGCONT);
  EXPECT_EQ(hung.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << hung.status.error_message();
  EXPECT_NE(hung.status.error_message().find("--target-step-deadline-s"), std::string::npos)
      << hung.status.error_message();
}

// Issue 19.4: the target's gauges stayed at their last values after its router died.
TEST_F(SplitFailureTest, RouterDeathResetsTheTargetsLoadGauges) {
  Deployment d;
  ASSERT_TRUE(d.StartSplit(TinyServedModelDirs())) << d.error();
  auto stub = v1::Generation::NewStub(Channel(d.router().port()));
  auto gauge = [&](const std::string& name) {
    HttpResponse r = HttpGet(d.target().metrics_port(), "/metrics");
    const size_t at = r.body.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::atof(r.body.c_str() + at + name.size() + 2);
  };
  std::vector<std::thread> clients;
  for (int i = 0; i < 3; ++i) {
    clients.emplace_back([&, i] {
      (void)Stream(*stub, GreedyRequest(Prompt(reference_->tokenizer(), i), 950, "none"), 60s);
    });
  }
  double running = 0;
  for (int i = 0; i < 500 && running <= 0; ++i) {
    running = gauge("specula_num_requests_running");
    if (running <= 0) std::this_thread::sleep_for(20ms);
  }
  ASSERT_GT(running, 0) << "the requests never ran";
  EXPECT_GT(gauge("specula_kv_cache_usage_perc"), 0);
  d.router().Stop(SIGKILL);
  for (auto& t : clients) t.join();
  for (int i = 0; i < 500 && running != 0; ++i) {
    running = gauge("specula_num_requests_running");
    if (running != 0) std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(running, 0);
  EXPECT_EQ(gauge("specula_kv_cache_usage_perc"), 0);
}

}  // namespace
}  // namespace specula
