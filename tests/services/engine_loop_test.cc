// EngineLoop without gRPC: served greedy output equals plain decoding for every drafter, events
// carry incremental text, cancellation and deadlines free KV blocks, the queue limit, requests
// that can never fit the KV cache, and shutdown.
#include "services/router/engine_loop.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <atomic>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/util/mapped_file.h"
#include "tests/services/gated_backend.h"
#include "tests/services/served_stack.h"
#include "tests/services/served_test_model.h"
#include "tests/testing/temp_dir.h"

namespace specula::router {
namespace {

using namespace std::chrono_literals;

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  LoopEvent last;
  int events = 0;
};

Collected Collect(RequestChannel& channel, std::chrono::seconds timeout = 120s) {
  Collected c;
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    for (LoopEvent& e : channel.Wait(50ms)) {
      ++c.events;
      c.tokens.insert(c.tokens.end(), e.token_ids.begin(), e.token_ids.end());
      c.text += e.text;
      if (e.finished) {
        c.last = std::move(e);
        return c;
      }
    }
  }
  ADD_FAILURE() << "no final event within the timeout";
  return c;
}

// Waits until nothing is in flight and the KV cache is empty again.
bool WaitIdle(const EngineLoop& loop, std::chrono::seconds timeout = 30s) {
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    LoadSnapshot s = loop.load();
    if (s.in_flight == 0 && s.running == 0 && s.waiting == 0 && s.kv_cache_blocks_used == 0) {
      return true;
    }
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

LoopRequest Greedy(std::vector<int32_t> prompt, int64_t max_new_tokens, std::string drafter) {
  LoopRequest r;
  r.spec.generation.prompt = std::move(prompt);
  r.spec.generation.max_new_tokens = max_new_tokens;
  r.spec.speculation.drafter = std::move(drafter);
  r.spec.speculation.max_draft_tokens = 4;
  return r;
}

// Every test runs on both transports: the router, target and drafters in one process, and the
// three talking gRPC over 127.0.0.1.
class EngineLoopTest : public ::testing::TestWithParam<Transport> {
 protected:
  static void SetUpTestSuite() { reference_ = new ReferenceDecoder(TinyServedModelDirs().target); }
  static void TearDownTestSuite() {
    delete reference_;
    reference_ = nullptr;
  }

  std::unique_ptr<EngineLoop> MakeLoop(EngineLoopOptions options = {}, KvCacheOptions kv = {}) {
    const TestModelDirs& dirs = TinyServedModelDirs();
    stack_ =
        std::make_unique<ServedStack>(GetParam(), dirs.target, dirs.draft, SpecEngineOptions{}, kv);
    auto loop = EngineLoop::Create(stack_->TakeModel(), options, &metrics_);
    EXPECT_TRUE(loop.ok()) << loop.status();
    return loop.ok() ? std::move(*loop) : nullptr;
  }

  // A loop whose target backend is wrapped in a `Wrapper` (a test double around the real one),
  // returned in `*wrapper`.
  template <typename Wrapper>
  std::unique_ptr<EngineLoop> MakeWrappedLoop(Wrapper** wrapper, EngineLoopOptions options = {}) {
    const TestModelDirs& dirs = TinyServedModelDirs();
    stack_ = std::make_unique<ServedStack>(GetParam(), dirs.target, dirs.draft);
    ServedModel model = stack_->TakeModel();
    auto wrapped = std::make_unique<Wrapper>(std::move(model.backend));
    *wrapper = wrapped.get();
    model.backend = std::move(wrapped);
    auto loop = EngineLoop::Create(std::move(model), options, &metrics_);
    EXPECT_TRUE(loop.ok()) << loop.status();
    return loop.ok() ? std::move(*loop) : nullptr;
  }

  std::unique_ptr<ServedStack> stack_;  // outlives the test's loop (a local of the test body)

  static ReferenceDecoder* reference_;
  RouterMetrics metrics_;
};

ReferenceDecoder* EngineLoopTest::reference_ = nullptr;

TEST_P(EngineLoopTest, ServedGreedyEqualsPlainDecodingForEveryDrafter) {
  auto loop = MakeLoop();
  ASSERT_TRUE(loop);
  const Tokenizer& tok = reference_->tokenizer();
  struct Case {
    std::vector<int32_t> prompt;
    int64_t max_new;
    std::string drafter;
  };
  std::vector<Case> cases;
  const std::vector<std::string> prompts = {"def f(x):\n    return x", "import os\n", "class A:"};
  for (const std::string drafter : {"none", "ngram", "draft-model"}) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      cases.push_back({tok.Encode(prompts[i]), 10 + 13 * static_cast<int64_t>(i), drafter});
    }
  }
  // All submitted at once, so they share engine steps.
  std::vector<std::shared_ptr<RequestChannel>> channels;
  for (const Case& c : cases) {
    auto ch = loop->Submit(Greedy(c.prompt, c.max_new, c.drafter));
    ASSERT_TRUE(ch.ok()) << ch.status();
    channels.push_back(*ch);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    Collected got = Collect(*channels[i]);
    const std::vector<int32_t> expected = reference_->Greedy(cases[i].prompt, cases[i].max_new);
    EXPECT_EQ(got.tokens, expected) << cases[i].drafter << " case " << i;
    EXPECT_EQ(got.text, tok.Decode(expected, /*skip_special_tokens=*/true).value());
    EXPECT_TRUE(got.last.status.ok()) << got.last.status;
    EXPECT_EQ(got.last.finish_reason, FinishReason::kLength);
    EXPECT_EQ(got.last.completion_tokens, cases[i].max_new);
    EXPECT_EQ(got.last.prompt_tokens, static_cast<int64_t>(cases[i].prompt.size()));
    if (cases[i].drafter != "none") {
      EXPECT_GT(got.last.stats.draft_tokens, 0);
    }
    EXPECT_GT(got.events, 1);  // streamed step by step, not in one piece
  }
  EXPECT_TRUE(WaitIdle(*loop));
}

// A metric's value in Prometheus text (the first sample of that name), -1 if absent.
double MetricValue(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    // "name value" or "name{labels} value".
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    const char next = line[name.size()];
    if (next != ' ' && next != '{') continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

TEST_P(EngineLoopTest, AdaptiveBudgetsAreAppliedThroughTheTargetAndKeepGreedyOutput) {
  // The router's policy plans every step's budgets and the target (in process or over gRPC)
  // applies them: no verified tree is larger than what was planned. Probing every sequence left at
  // 0 for one plan makes budgets change from step to step whatever the policy concludes.
  EngineLoopOptions options;
  options.adaptive_draft_budget = true;
  options.draft_budget = {
      .probe_after = 1, .probe_nodes = 3, .explore_every = 2, .exploration_share = 1.0};
  TempDir dir;
  const std::string trace_path = dir.File("steps.jsonl");
  auto trace = StepTrace::Open(trace_path);
  ASSERT_TRUE(trace.ok()) << trace.status();
  options.step_trace = std::move(*trace);
  auto loop = MakeLoop(options);
  ASSERT_TRUE(loop);
  ASSERT_TRUE(loop->info().adaptive_draft_budget);
  const Tokenizer& tok = reference_->tokenizer();
  const std::vector<std::string> prompts = {"def f(x):\n    return x", "import os\n", "class A:"};
  struct Case {
    std::vector<int32_t> prompt;
    int64_t max_new;
  };
  std::vector<Case> cases;
  std::vector<std::shared_ptr<RequestChannel>> channels;
  for (const std::string drafter : {"ngram", "draft-model"}) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      cases.push_back({tok.Encode(prompts[i]), 20 + 7 * static_cast<int64_t>(i)});
      LoopRequest r = Greedy(cases.back().prompt, cases.back().max_new, drafter);
      r.spec.speculation.max_draft_tokens = 5;
      auto ch = loop->Submit(std::move(r));
      ASSERT_TRUE(ch.ok()) << ch.status();
      channels.push_back(*ch);
    }
  }
  int64_t drafted = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    Collected got = Collect(*channels[i]);
    EXPECT_EQ(got.tokens, reference_->Greedy(cases[i].prompt, cases[i].max_new)) << i;
    EXPECT_TRUE(got.last.status.ok()) << got.last.status;
    EXPECT_LE(got.last.stats.draft_tokens, 5 * got.last.stats.draft_steps) << "cap";
    drafted += got.last.stats.draft_tokens;
  }
  EXPECT_TRUE(WaitIdle(*loop));
  EXPECT_GT(drafted, 0);
  // The step trace (--step-trace): every step the router planned, each tree within its plan, and
  // every token generated.
  int64_t traced_tokens = 0, expected_tokens = 0, traced_nodes = 0;
  for (const Case& c : cases) expected_tokens += c.max_new;
  std::istringstream lines(ReadFileToString(trace_path).value());
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j["label"], "router");
    traced_tokens += j["new_tokens"].get<int64_t>();
    traced_nodes += j["draft_nodes"].get<int64_t>();
    if (j.contains("plan")) {
      EXPECT_LE(j["draft_nodes"].get<int64_t>(), j["plan"]["nodes"].get<int64_t>()) << line;
    }
  }
  EXPECT_EQ(traced_tokens, expected_tokens);
  EXPECT_GT(traced_nodes, 0);
  const std::string text = metrics_.Text();
  const double planned = MetricValue(text, "specula_draft_budget_nodes_sum");
  EXPECT_GT(MetricValue(text, "specula_draft_budget_nodes_count"), 0) << text;
  EXPECT_GE(planned, static_cast<double>(drafted)) << "a tree larger than its planned budget";
  EXPECT_GT(MetricValue(text, "specula_draft_budget_predicted_seconds_total"), 0);
  // What came back of the budgets, per drafter and position: a probability (-1: not exported).
  const double supply = MetricValue(text, "specula_draft_budget_supply");
  EXPECT_GE(supply, 0) << text;
  EXPECT_LE(supply, 1) << text;
  // What a streak adds to acceptance, per drafter, streak and position: exported for each streak,
  // a probability difference.
  for (const char* streak : {"full", "partial", "rejected"}) {
    const std::string key = std::string("streak=\"") + streak + "\"";
    const size_t at = text.find(key);
    ASSERT_NE(at, std::string::npos) << streak << "\n" << text;
    const size_t line = text.rfind('\n', at) + 1;
    EXPECT_EQ(text.compare(line, 33, "specula_draft_budget_streak_shift"), 0) << text.substr(line);
    const double shift = std::stod(text.substr(text.find("} ", at) + 2));
    EXPECT_GE(shift, -1) << text;
    EXPECT_LE(shift, 1) << text;
  }
}

TEST_P(EngineLoopTest, StopStringEndsTheRequestAndFreesItsBlocks) {
  auto loop = MakeLoop();
  ASSERT_TRUE(loop);
  const Tokenizer& tok = reference_->tokenizer();
  const std::vector<int32_t> prompt = tok.Encode("def f(x):");
  const std::vector<int32_t> full = reference_->Greedy(prompt, 60);
  const std::string text = tok.Decode(full, true).value();
  ASSERT_GT(text.size(), 12u);
  size_t begin = text.size() / 2;  // two bytes from the middle, widened to whole characters
  while ((static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) ++begin;
  size_t end = begin + 2;
  while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
  const std::string stop = text.substr(begin, end - begin);
  const size_t at = text.find(stop);
  for (const std::string drafter : {"none", "ngram"}) {
    LoopRequest r = Greedy(prompt, 60, drafter);
    r.stop_strings = {stop, "never-generated-stop"};
    auto ch = loop->Submit(std::move(r));
    ASSERT_TRUE(ch.ok());
    Collected got = Collect(**ch);
    EXPECT_EQ(got.last.finish_reason, FinishReason::kStopString) << drafter;
    EXPECT_EQ(got.last.stop_string, stop);
    EXPECT_EQ(got.text, text.substr(0, at)) << drafter;
    ASSERT_LE(got.tokens.size(), full.size());
    EXPECT_TRUE(std::equal(got.tokens.begin(), got.tokens.end(), full.begin()));
    EXPECT_EQ(got.last.completion_tokens, static_cast<int64_t>(got.tokens.size()));
  }
  EXPECT_TRUE(WaitIdle(*loop));
}

TEST_P(EngineLoopTest, CancelledAndExpiredRequestsFreeTheirBlocksWithoutDisturbingOthers) {
  auto loop = MakeLoop();
  ASSERT_TRUE(loop);
  const std::vector<int32_t> prompt = {5, 6, 7, 8, 9};
  auto long_one = loop->Submit(Greedy(prompt, 1000, "none"));
  LoopRequest expiring = Greedy(prompt, 1000, "none");
  expiring.deadline = Clock::now() + 40ms;
  auto expired = loop->Submit(std::move(expiring));
  auto normal = loop->Submit(Greedy({10, 11, 12}, 40, "ngram"));
  ASSERT_TRUE(long_one.ok() && expired.ok() && normal.ok());
  // Wait for the long request's first tokens: it holds KV blocks now.
  std::vector<LoopEvent> first;
  while (first.empty()) first = (*long_one)->Wait(1s);
  EXPECT_GT(loop->load().kv_cache_blocks_used, 0);
  loop->Cancel(**long_one);
  Collected cancelled = Collect(**long_one);
  EXPECT_EQ(cancelled.last.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(cancelled.last.status.code(), StatusCode::kCancelled);
  Collected deadline = Collect(**expired);
  EXPECT_EQ(deadline.last.status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_LT(deadline.tokens.size(), 1000u);
  Collected ok = Collect(**normal);
  EXPECT_EQ(ok.tokens, reference_->Greedy({10, 11, 12}, 40));
  EXPECT_TRUE(WaitIdle(*loop));
  EXPECT_NE(metrics_.Text().find("specula_request_success_total{finished_reason=\"abort\",specula_"
                                 "reason=\"cancelled\"} 2"),
            std::string::npos);
}

TEST_P(EngineLoopTest, QueuedRequestsThatLeaveNeverStopTheLoop) {
  // One sequence per step: everything submitted behind the long request stays queued, so the
  // deadlines and the client cancel below all end requests that never reached the target (issue
  // 19.1: they used to stay in the queue after being erased, and the next plan aborted).
  auto loop = MakeLoop({.max_batch_size = 1});
  ASSERT_TRUE(loop);
  auto running = loop->Submit(Greedy({5, 6, 7}, 1000, "none"));
  ASSERT_TRUE(running.ok());
  while ((*running)->Wait(1s).empty()) {
  }
  std::vector<std::shared_ptr<RequestChannel>> expiring;
  for (int i = 0; i < 8; ++i) {
    LoopRequest r = Greedy({5, 6, 7 + i}, 8, i % 2 ? "ngram" : "none");
    r.deadline = Clock::now() + std::chrono::milliseconds(1 + i);
    auto ch = loop->Submit(std::move(r));
    ASSERT_TRUE(ch.ok()) << ch.status();
    expiring.push_back(*ch);
  }
  auto cancelled = loop->Submit(Greedy({9, 10}, 8, "ngram"));
  auto behind = loop->Submit(Greedy({10, 11, 12}, 12, "ngram"));
  ASSERT_TRUE(cancelled.ok() && behind.ok());
  loop->Cancel(**cancelled);
  for (auto& ch : expiring) {
    Collected c = Collect(*ch);
    EXPECT_EQ(c.last.status.code(), StatusCode::kDeadlineExceeded) << c.last.status;
    EXPECT_TRUE(c.tokens.empty());
  }
  Collected c = Collect(**cancelled);
  EXPECT_EQ(c.last.status.code(), StatusCode::kCancelled) << c.last.status;
  loop->Cancel(**running);
  EXPECT_EQ(Collect(**running).last.status.code(), StatusCode::kCancelled);
  // The loop still serves: the request queued behind the ones that left runs to the end.
  EXPECT_EQ(Collect(**behind).tokens, reference_->Greedy({10, 11, 12}, 12));
  EXPECT_TRUE(WaitIdle(*loop));
}

TEST_P(EngineLoopTest, QueueLimitCountsWaitingAndRunningRequests) {
  auto loop = MakeLoop({.max_queue = 2});
  ASSERT_TRUE(loop);
  auto a = loop->Submit(Greedy({5, 6}, 1000, "none"));
  auto b = loop->Submit(Greedy({5, 7}, 1000, "none"));
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = loop->Submit(Greedy({5, 8}, 4, "none"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("max_queue"), std::string::npos) << c.status();
  loop->Cancel(**a);
  loop->Cancel(**b);
  Collect(**a);
  Collect(**b);
  auto d = loop->Submit(Greedy({5, 8}, 4, "none"));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(Collect(**d).tokens.size(), 4u);
}

TEST_P(EngineLoopTest, ValidationNamesTheFieldAndNeverReachesTheEngine) {
  auto loop = MakeLoop();
  ASSERT_TRUE(loop);
  auto expect_error = [&](LoopRequest r, StatusCode code, const std::string& text) {
    auto ch = loop->Submit(std::move(r));
    ASSERT_FALSE(ch.ok()) << text;
    EXPECT_EQ(ch.status().code(), code) << ch.status();
    EXPECT_NE(ch.status().message().find(text), std::string::npos) << ch.status();
  };
  expect_error(Greedy({}, 4, "none"), StatusCode::kInvalidArgument, "prompt is empty");
  expect_error(Greedy({1, 100000}, 4, "none"), StatusCode::kInvalidArgument, "vocabulary");
  expect_error(Greedy({1}, 0, "none"), StatusCode::kInvalidArgument, "max_new_tokens");
  expect_error(Greedy({1}, 5000, "none"), StatusCode::kOutOfRange, "max_new_tokens");
  expect_error(Greedy({1}, 4, "medusa"), StatusCode::kInvalidArgument, "unknown drafter 'medusa'");
  LoopRequest bad_stop = Greedy({1}, 4, "none");
  bad_stop.stop_strings = {""};
  expect_error(std::move(bad_stop), StatusCode::kInvalidArgument, "stop[0] is empty");
  LoopRequest bad_verify = Greedy({1}, 4, "ngram");
  bad_verify.spec.speculation.verify.specdec_beta = 0;
  expect_error(std::move(bad_verify), StatusCode::kInvalidArgument, "specdec_beta");
  EXPECT_EQ(loop->load().in_flight, 0);
}

TEST_P(EngineLoopTest, RequestThatCanNeverFitTheKvCacheFailsAlone) {
  // 40 blocks of 16 positions: a request needing 1000 positions can never be admitted.
  auto loop = MakeLoop({}, {.block_size = 16, .num_blocks = 40});
  ASSERT_TRUE(loop);
  auto huge = loop->Submit(Greedy({5, 6, 7}, 1000, "none"));
  auto small = loop->Submit(Greedy({5, 6, 7}, 20, "ngram"));
  ASSERT_TRUE(huge.ok() && small.ok());
  Collected h = Collect(**huge);
  EXPECT_EQ(h.last.status.code(), StatusCode::kResourceExhausted) << h.last.status;
  EXPECT_TRUE(h.tokens.empty());
  EXPECT_EQ(Collect(**small).tokens, reference_->Greedy({5, 6, 7}, 20));
}

TEST_P(EngineLoopTest, ShutdownEndsEveryRequestAndRefusesNewOnes) {
  auto loop = MakeLoop();
  ASSERT_TRUE(loop);
  auto running = loop->Submit(Greedy({5, 6, 7}, 1000, "none"));
  ASSERT_TRUE(running.ok());
  while ((*running)->Wait(1s).empty()) {
  }
  loop->Shutdown();
  Collected c = Collect(**running, 5s);
  EXPECT_EQ(c.last.status.code(), StatusCode::kUnavailable);
  auto after = loop->Submit(Greedy({5}, 4, "none"));
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), StatusCode::kUnavailable);
}

// Runs every step on the real backend, then, when told, throws as a LibTorch error or an
// allocation failure would (after the target ran the step, so it holds the step's requests).
class ThrowingBackend : public TargetBackend {
 public:
  explicit ThrowingBackend(std::unique_ptr<TargetBackend> inner) : inner_(std::move(inner)) {}
  TargetInfo info() const override { return inner_->info(); }
  void StartStep(StepPlan plan) override { inner_->StartStep(std::move(plan)); }
  StatusOr<StepOutcome> FinishStep() override {
    auto out = inner_->FinishStep();
    switch (throw_next.exchange(0)) {
      case 1:
        (void)at::zeros({2}).view({3});  // throws c10::Error
        break;
      case 2:
        throw std::bad_alloc();
    }
    return out;
  }
  std::atomic<int> throw_next{0};  // 1: c10::Error, 2: std::bad_alloc

 private:
  std::unique_ptr<TargetBackend> inner_;
};

TEST_P(EngineLoopTest, AnExceptionInAStepFailsItsRequestsAndTheLoopKeepsServing) {
  // Issue 19: an exception escaping a step reached std::terminate on the loop thread.
  ThrowingBackend* backend = nullptr;
  std::unique_ptr<EngineLoop> loop = MakeWrappedLoop(&backend);
  ASSERT_TRUE(loop);
  for (int kind : {1, 2}) {
    auto victim = loop->Submit(Greedy({5, 6, 7}, 1000, "none"));
    ASSERT_TRUE(victim.ok()) << victim.status();
    while ((*victim)->Wait(1s).empty()) {  // running on the target
    }
    backend->throw_next = kind;
    Collected v = Collect(**victim);
    EXPECT_EQ(v.last.finish_reason, FinishReason::kError);
    EXPECT_EQ(v.last.status.code(), StatusCode::kInternal) << v.last.status;
    EXPECT_THAT(v.last.status.message(), ::testing::HasSubstr("engine step failed: "));
    EXPECT_THAT(v.last.status.message(),
                ::testing::HasSubstr(kind == 1 ? "is invalid for input of size 2" : "bad_alloc"));
    // The loop goes on: the next request is served exactly, and the failed one's KV blocks are
    // freed on the target.
    auto next = loop->Submit(Greedy({5, 6, 7}, 20, "ngram"));
    ASSERT_TRUE(next.ok()) << next.status();
    Collected n = Collect(**next);
    EXPECT_TRUE(n.last.status.ok()) << n.last.status;
    EXPECT_EQ(n.tokens, reference_->Greedy({5, 6, 7}, 20));
    EXPECT_TRUE(WaitIdle(*loop));
  }
}

TEST_P(EngineLoopTest, TheNextStepRunsWhileAStepsTokensAreDelivered) {
  GatedBackend* backend = nullptr;
  std::unique_ptr<EngineLoop> loop = MakeWrappedLoop(&backend);
  ASSERT_TRUE(loop);
  for (const std::string drafter : {"none", "ngram"}) {
    const int idle = backend->started.load();
    auto channel = loop->Submit(Greedy({5, 6, 7}, 12, drafter));
    ASSERT_TRUE(channel.ok()) << channel.status();
    for (int i = 0; i < 6000 && backend->started.load() == idle; ++i)
      std::this_thread::sleep_for(10ms);
    ASSERT_EQ(backend->started.load(), idle + 1) << "the request's first step did not start";
    // Step by step: when a step's tokens reach the client, the step after it has started (and
    // cannot have ended: it waits for the test).
    std::vector<int32_t> tokens;
    bool finished = false;
    while (!finished) {
      const int started = backend->started.load();
      backend->Allow(1);
      std::vector<LoopEvent> events;
      for (int i = 0; i < 600 && events.empty(); ++i) events = (*channel)->Wait(100ms);
      ASSERT_FALSE(events.empty()) << "no event within a minute";
      for (const LoopEvent& e : events) {
        tokens.insert(tokens.end(), e.token_ids.begin(), e.token_ids.end());
        finished = finished || e.finished;
      }
      if (!finished) EXPECT_EQ(backend->started.load(), started + 1) << drafter;
    }
    EXPECT_EQ(tokens, reference_->Greedy({5, 6, 7}, 12)) << drafter;
  }
  backend->Allow(1 << 20);
  EXPECT_TRUE(WaitIdle(*loop));
}

TEST_P(EngineLoopTest, WithoutOverlapStepsServeTheSameTokensAndStopStrings) {
  GatedBackend* backend = nullptr;
  std::unique_ptr<EngineLoop> loop = MakeWrappedLoop(&backend, {.overlap_steps = false});
  ASSERT_TRUE(loop);
  const Tokenizer& tok = reference_->tokenizer();
  const std::vector<int32_t> prompt = tok.Encode("def f(x):");
  const std::string text = tok.Decode(reference_->Greedy(prompt, 40), true).value();
  ASSERT_GT(text.size(), 12u);
  size_t begin = text.size() / 2;  // one whole character from the middle
  while ((static_cast<unsigned char>(text[begin]) & 0xC0) == 0x80) ++begin;
  size_t end = begin + 1;
  while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
  const std::string stop = text.substr(begin, end - begin);
  LoopRequest stopped = Greedy(prompt, 40, "ngram");
  stopped.stop_strings = {stop};
  auto channel = loop->Submit(Greedy({5, 6, 7}, 12, "draft-model"));
  auto stop_channel = loop->Submit(std::move(stopped));
  ASSERT_TRUE(channel.ok() && stop_channel.ok());
  backend->Allow(1 << 20);
  EXPECT_EQ(Collect(**channel).tokens, reference_->Greedy({5, 6, 7}, 12));
  Collected c = Collect(**stop_channel);
  EXPECT_EQ(c.last.finish_reason, FinishReason::kStopString);
  EXPECT_EQ(c.text, text.substr(0, text.find(stop)));
  EXPECT_TRUE(WaitIdle(*loop));
}

TEST_P(EngineLoopTest, CreateRejectsAnUnknownDefaultDrafter) {
  const TestModelDirs& dirs = TinyServedModelDirs();
  ServedStack stack(GetParam(), dirs.target, "");
  auto loop = EngineLoop::Create(stack.TakeModel(), {.default_drafter = "draft-model"});
  ASSERT_FALSE(loop.ok());
  EXPECT_NE(loop.status().message().find("default drafter 'draft-model'"), std::string::npos)
      << loop.status();
}

INSTANTIATE_TEST_SUITE_P(Transports, EngineLoopTest,
                         ::testing::Values(Transport::kInProcess, Transport::kGrpc),
                         [](const auto& info) { return TransportName(info.param); });

}  // namespace
}  // namespace specula::router
