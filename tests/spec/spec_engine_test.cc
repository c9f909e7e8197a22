// SpecEngine on tiny random models with scripted drafters: greedy output equals plain decoding
// whatever the drafter proposes (right, wrong, random trees, invalid trees, failures), sequences
// join and finish independently, KV blocks are returned, and requests are validated.
#include "common/spec/spec_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <tuple>

#include <ATen/ATen.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "common/engine/plain_decoder.h"
#include "tests/testing/tiny_model.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

// Knows the reference continuation of every prompt and proposes from it, optionally corrupted.
// Each sequence is identified by matching its history against the references.
class ScriptedDrafter : public Drafter {
 public:
  enum class Kind {
    kOracle,      // the true continuation as a chain
    kRandomTree,  // random trees that sometimes contain the true path
    kBadTree,     // invalid trees (by sequence: OOV token, over budget, parent after child)
    kWideTree,    // max_nodes siblings at depth 1: the most cache positions a budget allows
  };
  ScriptedDrafter(std::string name, Kind kind, std::vector<std::vector<int32_t>> references,
                  int32_t vocab)
      : name_(std::move(name)), kind_(kind), references_(std::move(references)), vocab_(vocab) {}

  std::string name() const override { return name_; }
  Status AddSequence(SeqId seq, const SamplingParams&) override {
    if (history_.count(seq)) return AlreadyExistsError("seq");
    history_[seq] = {};
    added_.push_back(seq);
    return OkStatus();
  }
  DrafterCapacity capacity() const override { return cap; }
  void ReleaseSequence(SeqId seq) override {
    history_.erase(seq);
    ++released;
  }
  Status Observe(const std::vector<DrafterObservation>& observations) override {
    if (fail_observe) return InternalError("scripted observe failure");
    if (throw_observe) throw std::bad_alloc();
    for (const auto& o : observations) {  // all or nothing, as Drafter::Observe requires
      if (Nth(o.seq, refuse_observe_nth)) {
        return ResourceExhaustedError(StrCat("scripted cache full for sequence ", o.seq));
      }
    }
    for (const auto& o : observations) {
      auto& h = history_.at(o.seq);
      h.insert(h.end(), o.tokens.begin(), o.tokens.end());
    }
    return OkStatus();
  }
  StatusOr<std::vector<CandidateTree>> Propose(const std::vector<DraftRequest>& requests) override {
    if (fail_propose) return InternalError("scripted propose failure");
    if (throw_propose) (void)at::zeros({2}).view({3});  // throws c10::Error
    last_requests = requests;
    for (const auto& r : requests) {
      if (Nth(r.seq, refuse_propose_nth)) return InternalError("scripted propose refusal");
    }
    std::vector<CandidateTree> trees;
    for (const auto& r : requests) {
      const auto& h = history_.at(r.seq);
      std::vector<int32_t> truth;
      for (const auto& ref : references_) {
        if (ref.size() >= h.size() && std::equal(h.begin(), h.end(), ref.begin())) {
          truth.assign(ref.begin() + h.size(), ref.end());
          break;
        }
      }
      const int32_t n = std::min({r.max_nodes, r.max_depth, static_cast<int32_t>(truth.size())});
      CandidateTree tree;
      switch (kind_) {
        case Kind::kOracle:
          tree = CandidateTree::Chain(std::span<const int32_t>(truth.data(), n));
          break;
        case Kind::kRandomTree: {
          // Up to max_nodes nodes: each picks a random earlier parent (depth-limited) and a token
          // that is the true next token of its path with probability 1/2.
          std::uniform_int_distribution<int32_t> token(0, vocab_ - 1);
          const int32_t size = std::uniform_int_distribution<int32_t>(0, r.max_nodes)(rng_);
          for (int32_t i = 0; i < size; ++i) {
            int32_t parent = std::uniform_int_distribution<int32_t>(-1, tree.size() - 1)(rng_);
            while (parent >= 0 && tree.depth(parent) >= r.max_depth) parent = tree.parent(parent);
            const int32_t depth = parent < 0 ? 1 : tree.depth(parent) + 1;
            bool on_truth = depth <= static_cast<int32_t>(truth.size());
            if (parent >= 0 && on_truth) {
              for (int32_t a : tree.PathTo(parent)) {
                if (tree.token(a) != truth[tree.depth(a) - 1]) on_truth = false;
              }
            }
            const bool right = on_truth && (rng_() % 2 == 0);
            tree.AddNode(parent, right ? truth[depth - 1] : token(rng_));
          }
          break;
        }
        case Kind::kWideTree:
          for (int32_t i = 0; i < r.max_nodes; ++i) tree.AddNode(-1, (i * 7 + 1) % vocab_);
          break;
        case Kind::kBadTree: {
          const int64_t which = r.seq % 3;
          if (which == 0) {
            tree.AddNode(-1, vocab_ + 5);  // outside the vocabulary
          } else if (which == 1) {
            for (int32_t i = 0; i <= r.max_nodes; ++i) tree.AddNode(-1, 1);  // over budget
          } else {
            tree.AddNode(-1, 1);
            tree.AddNode(3, 2);  // parent after child
          }
          break;
        }
      }
      trees.push_back(std::move(tree));
    }
    return trees;
  }

  bool fail_propose = false;
  bool fail_observe = false;
  bool throw_propose = false;
  bool throw_observe = false;
  // Calls naming the n-th sequence added (0-based) fail as a whole.
  std::set<size_t> refuse_observe_nth;
  std::set<size_t> refuse_propose_nth;
  DrafterCapacity cap;
  int released = 0;
  std::vector<DraftRequest> last_requests;  // of the last Propose

 private:
  bool Nth(SeqId seq, const std::set<size_t>& which) const {
    for (size_t n : which) {
      if (n < added_.size() && added_[n] == seq) return true;
    }
    return false;
  }
  std::vector<SeqId> added_;
  std::string name_;
  Kind kind_;
  std::vector<std::vector<int32_t>> references_;
  int32_t vocab_;
  std::map<SeqId, std::vector<int32_t>> history_;
  std::mt19937 rng_{7};
};

// Records the tokens and target hidden states it observes, and proposes random chains, so that
// the hidden rows of accepted and rejected positions are exercised.
class HiddenRecordingDrafter : public Drafter {
 public:
  std::string name() const override { return "hidden"; }
  const std::vector<int64_t>& hidden_layers() const override { return layers_; }
  std::vector<int64_t> layers_ = {0, 1, 2};
  bool refuse_re_adds = false;  // AddSequence fails for a sequence added before
  Status AddSequence(SeqId seq, const SamplingParams&) override {
    if (refuse_re_adds && !added_.insert(seq).second) return InternalError("re-add refused");
    seen_[seq] = {};
    return OkStatus();
  }
  void ReleaseSequence(SeqId seq) override { finished_.push_back(std::move(seen_.at(seq))); }
  Status Observe(const std::vector<DrafterObservation>& observations) override {
    for (const auto& o : observations) {
      Seen& s = seen_.at(o.seq);
      if (s.tokens.empty()) s.first_tokens = static_cast<int64_t>(o.tokens.size());
      s.tokens.insert(s.tokens.end(), o.tokens.begin(), o.tokens.end());
      if (o.hidden.size() != 3) return InternalError("expected 3 hidden layers");
      for (size_t l = 0; l < 3; ++l) s.hidden[l].push_back(o.hidden[l].to(at::kFloat));
    }
    return OkStatus();
  }
  StatusOr<std::vector<CandidateTree>> Propose(const std::vector<DraftRequest>& requests) override {
    std::vector<CandidateTree> trees;
    for (const auto& r : requests) {
      CandidateTree t;
      for (int32_t i = 0; i < std::min(r.max_nodes, r.max_depth); ++i) {
        t.AddNode(i - 1, static_cast<int32_t>(rng_() % 64));
      }
      trees.push_back(std::move(t));
    }
    return trees;
  }

  struct Seen {
    int64_t first_tokens = 0;  // of its first Observe
    std::vector<int32_t> tokens;
    std::vector<at::Tensor> hidden[3];
  };
  std::vector<Seen> finished_;

 private:
  std::map<SeqId, Seen> seen_;
  std::set<SeqId> added_;
  std::mt19937 rng_{3};
};

class SpecEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = TinyModelConfig();
    ModelRunnerOptions options;
    options.kv.memory_mb = 4;
    auto runner = ModelRunner::FromModule(MakeTinyModel(config_, 3, 10.0), options);
    ASSERT_TRUE(runner.ok()) << runner.status();
    target_ = std::move(*runner);
  }

  std::vector<GenerationRequest> Prompts(int n, int64_t max_new, uint64_t seed = 1) {
    std::mt19937 rng(seed);
    std::vector<GenerationRequest> out;
    for (int i = 0; i < n; ++i) {
      GenerationRequest r;
      const int len = 1 + static_cast<int>(rng() % 20);
      for (int j = 0; j < len; ++j) r.prompt.push_back(static_cast<int32_t>(rng() % 64));
      r.max_new_tokens = max_new + static_cast<int64_t>(rng() % 5);
      out.push_back(r);
    }
    return out;
  }

  std::vector<std::vector<int32_t>> Plain(const std::vector<GenerationRequest>& requests) {
    auto results = DecodeBatch(*target_, requests);
    EXPECT_TRUE(results.ok()) << results.status();
    std::vector<std::vector<int32_t>> out;
    for (const auto& r : *results) out.push_back(r.tokens);
    return out;
  }

  // Prompt + reference continuation, for the scripted drafters.
  static std::vector<std::vector<int32_t>> References(
      const std::vector<GenerationRequest>& requests,
      const std::vector<std::vector<int32_t>>& plain) {
    std::vector<std::vector<int32_t>> refs;
    for (size_t i = 0; i < requests.size(); ++i) {
      auto r = requests[i].prompt;
      r.insert(r.end(), plain[i].begin(), plain[i].end());
      refs.push_back(r);
    }
    return refs;
  }

  static std::vector<SpecRequest> WithDrafter(const std::vector<GenerationRequest>& requests,
                                              const std::string& drafter, int32_t k) {
    std::vector<SpecRequest> out;
    for (const auto& g : requests) {
      out.push_back({.generation = g, .speculation = {.drafter = drafter, .max_draft_tokens = k}});
    }
    return out;
  }

  static std::vector<std::vector<int32_t>> Tokens(const std::vector<SpecGenerationResult>& r) {
    std::vector<std::vector<int32_t>> out;
    for (const auto& x : r) out.push_back(x.result.tokens);
    return out;
  }

  // Every sequence the drafter saw: its observed tokens are the sequence's, in order, and its
  // hidden rows are the target's states of all but the pending token.
  // Submits every request; their ids in order.
  static std::vector<RequestId> SubmitAll(SpecEngine& engine,
                                          const std::vector<SpecRequest>& requests) {
    std::vector<RequestId> ids;
    for (const SpecRequest& r : requests) {
      auto id = engine.Submit(r);
      EXPECT_TRUE(id.ok()) << id.status();
      if (id.ok()) ids.push_back(*id);
    }
    return ids;
  }

  // Steps `engine` until it has no work, setting every request's budget to budget(step) before
  // each step and passing each update to on_update(step, update); each request's tokens.
  static std::map<RequestId, std::vector<int32_t>> StepWithBudgets(
      SpecEngine& engine, const std::vector<RequestId>& ids,
      const std::function<int32_t(int)>& budget,
      const std::function<void(int, const RequestUpdate&)>& on_update) {
    std::map<RequestId, std::vector<int32_t>> out;
    for (int step = 0; engine.HasWork(); ++step) {
      for (RequestId id : ids) (void)engine.SetDraftBudget(id, budget(step));
      auto report = engine.Step();
      EXPECT_TRUE(report.ok()) << report.status();
      if (!report.ok()) break;
      for (const RequestUpdate& u : report->updates) {
        out[u.id].insert(out[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
        EXPECT_TRUE(u.error.ok()) << u.error;
        on_update(step, u);
      }
    }
    return out;
  }

  // Each drafter epoch (AddSequence to ReleaseSequence) observed a contiguous run of one
  // sequence's tokens (from its start unless a drafter_context restarted it), with the target's
  // hidden states of those positions. Returns each epoch's offset in its sequence (-1: it
  // observed nothing).
  std::vector<int64_t> ExpectObservedMatchesTarget(const HiddenRecordingDrafter& drafter,
                                                   const std::vector<GenerationRequest>& requests,
                                                   const std::vector<std::vector<int32_t>>& plain) {
    std::vector<int64_t> offsets;
    auto reference = ModelRunner::FromModule(target_->module(), {});
    EXPECT_TRUE(reference.ok());
    if (!reference.ok()) return offsets;
    for (const auto& seen : drafter.finished_) {
      offsets.push_back(-1);
      if (seen.tokens.empty()) continue;  // detached before observing anything
      // Which request and where: the observed tokens are a run of its prompt + continuation.
      std::vector<int32_t> full;
      size_t i = 0;
      for (; i < requests.size(); ++i) {
        full = requests[i].prompt;
        full.insert(full.end(), plain[i].begin(), plain[i].end());
        auto found = std::search(full.begin(), full.end(), seen.tokens.begin(), seen.tokens.end());
        if (found == full.end()) continue;
        offsets.back() = found - full.begin();
        break;
      }
      EXPECT_LT(i, requests.size()) << "observed tokens are no run of any sequence";
      if (i == requests.size()) continue;
      const int64_t at = offsets.back();
      const SeqId seq = static_cast<SeqId>(100 + i);
      if (!(*reference)->HasSequence(seq)) EXPECT_TRUE((*reference)->AddSequence(seq).ok());
      EXPECT_TRUE((*reference)->Truncate(seq, 0).ok());
      auto out =
          (*reference)
              ->Forward({.seqs = {{.seq = seq, .tokens = full}}, .hidden_layers = {0, 1, 2}});
      EXPECT_TRUE(out.ok()) << out.status();
      if (!out.ok()) continue;
      for (int l = 0; l < 3; ++l) {
        // Hidden rows cover all but the pending token.
        at::Tensor got = at::cat(seen.hidden[l], 0);
        EXPECT_EQ(got.size(0), static_cast<int64_t>(seen.tokens.size()) - 1) << "layer " << l;
        at::Tensor want = out->hidden[l].slice(0, at, at + got.size(0)).to(at::kFloat);
        // Relative to the layer's scale (weight_scale 10 makes activations large); a wrong row
        // would be off by O(1).
        const float scale = want.abs().max().item<float>();
        const float diff = (got - want).abs().max().item<float>();
        EXPECT_LT(diff, 1e-4f * scale)
            << "layer " << l << " max diff " << diff << " scale " << scale;
      }
    }
    return offsets;
  }

  ModelConfig config_;
  std::unique_ptr<ModelRunner> target_;
};

TEST_F(SpecEngineTest, WithoutSpeculationEqualsPlainDecodingGreedyAndSampled) {
  auto requests = Prompts(6, 12);
  for (size_t i = 0; i < requests.size(); i += 2) {
    requests[i].sampling = {.temperature = 0.9f, .top_k = 20, .top_p = 0.95f, .seed = 40 + i};
  }
  requests[1].stop_token_ids = {Plain({requests[1]})[0][3]};
  const auto plain = Plain(requests);
  SpecEngine engine(target_.get());
  auto results = GenerateAll(engine, WithDrafter(requests, "none", 0));
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(Tokens(*results), plain);
  EXPECT_EQ((*results)[1].result.finish_reason, FinishReason::kStop);
  EXPECT_EQ((*results)[0].result.finish_reason, FinishReason::kLength);
}

TEST_F(SpecEngineTest, OracleDraftsAreAllAcceptedAndOutputIsUnchanged) {
  const auto requests = Prompts(5, 20);
  const auto plain = Plain(requests);
  for (int32_t k : {1, 3, 8}) {
    SpecEngine engine(target_.get());
    ASSERT_TRUE(engine
                    .AddDrafter(std::make_unique<ScriptedDrafter>(
                        "oracle", ScriptedDrafter::Kind::kOracle, References(requests, plain), 64))
                    .ok());
    SpecRunStats run;
    auto results = GenerateAll(engine, WithDrafter(requests, "oracle", k), nullptr, &run);
    ASSERT_TRUE(results.ok()) << results.status();
    EXPECT_EQ(Tokens(*results), plain) << "k=" << k;
    for (const auto& r : *results) {
      EXPECT_EQ(r.stats.accepted_tokens, r.stats.draft_tokens) << "k=" << k;
      EXPECT_EQ(static_cast<int64_t>(r.result.tokens.size()),
                1 + r.stats.steps + r.stats.accepted_tokens);
      EXPECT_EQ(r.stats.draft_errors, 0);
      EXPECT_FALSE(r.stats.lossy);
      // Every step drafts, except a last one with a single token left to generate.
      EXPECT_GE(r.stats.draft_steps, r.stats.steps - 1);
      if (k == 1) {
        EXPECT_EQ(r.stats.accepted_tokens, r.stats.draft_steps);
      }
    }
    EXPECT_EQ(target_->kv_stats().free_blocks, target_->kv_stats().num_blocks);
  }
}

// SetDraftBudget's prices reach the drafter's requests; a price out of range is clamped
// (min_reach to [0, 1], depth_reach to at least 0) and a non-finite one read as no price.
TEST_F(SpecEngineTest, DraftPricesReachTheDrafterWithinTheirRanges) {
  const auto requests = Prompts(1, 20);
  const auto plain = Plain(requests);
  SpecEngine engine(target_.get());
  auto drafter = std::make_unique<ScriptedDrafter>("oracle", ScriptedDrafter::Kind::kOracle,
                                                   References(requests, plain), 64);
  ScriptedDrafter* raw = drafter.get();
  ASSERT_TRUE(engine.AddDrafter(std::move(drafter)).ok());
  auto id = engine.Submit(WithDrafter(requests, "oracle", 4)[0]);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(engine.Step().ok());  // prefill
  const double nan = std::nan("");
  const double inf = std::numeric_limits<double>::infinity();
  struct Want {
    double min_reach, depth_reach, seen_min, seen_depth;
  };
  for (const Want& w : {Want{0.3, 2.5, 0.3, 2.5}, Want{1.7, -1, 1, 0}, Want{nan, inf, 0, 0},
                        Want{-0.2, nan, 0, 0}}) {
    ASSERT_TRUE(engine.SetDraftBudget(*id, 2, w.min_reach, w.depth_reach).ok());
    raw->last_requests.clear();
    ASSERT_TRUE(engine.Step().ok());
    ASSERT_EQ(raw->last_requests.size(), 1u) << "no draft was asked for";
    EXPECT_EQ(raw->last_requests[0].min_reach, w.seen_min) << w.min_reach;
    EXPECT_EQ(raw->last_requests[0].depth_reach, w.seen_depth) << w.depth_reach;
  }
}

TEST_F(SpecEngineTest, RandomTreesNeverChangeGreedyOutput) {
  const auto requests = Prompts(8, 24, 5);
  const auto plain = Plain(requests);
  for (int32_t k : {1, 2, 5, 8, 16}) {
    // Verification on the host and on the logits tensor (tensor_verifier.h) alternate.
    const VerifyPlacement placement = k % 2 ? VerifyPlacement::kHost : VerifyPlacement::kTensors;
    SpecEngine engine(target_.get(), {.verify_placement = placement});
    ASSERT_TRUE(
        engine
            .AddDrafter(std::make_unique<ScriptedDrafter>(
                "random", ScriptedDrafter::Kind::kRandomTree, References(requests, plain), 64))
            .ok());
    auto results = GenerateAll(engine, WithDrafter(requests, "random", k));
    ASSERT_TRUE(results.ok()) << results.status();
    EXPECT_EQ(Tokens(*results), plain) << "k=" << k;
    int64_t accepted = 0;
    for (const auto& r : *results) {
      accepted += r.stats.accepted_tokens;
      EXPECT_EQ(r.stats.draft_errors, 0) << r.stats.last_draft_error;
    }
    EXPECT_GT(accepted, 0) << "k=" << k;
  }
}

TEST_F(SpecEngineTest, SequencesJoinAndFinishIndependently) {
  const auto requests = Prompts(9, 10, 9);
  const auto plain = Plain(requests);
  SpecEngine engine(target_.get(), {.max_batch_size = 4});
  ASSERT_TRUE(
      engine
          .AddDrafter(std::make_unique<ScriptedDrafter>(
              "random", ScriptedDrafter::Kind::kRandomTree, References(requests, plain), 64))
          .ok());
  std::map<RequestId, size_t> index;
  std::vector<std::vector<int32_t>> got(requests.size());
  std::vector<bool> done(requests.size());
  size_t submitted = 0;
  int steps = 0;
  int max_running = 0;
  while (submitted < requests.size() || engine.HasWork()) {
    // A new request every other step, with and without speculation.
    if (submitted < requests.size() && steps % 2 == 0) {
      SpecRequest r{.generation = requests[submitted]};
      if (submitted % 3 != 0) r.speculation = {.drafter = "random", .max_draft_tokens = 4};
      auto id = engine.Submit(r);
      ASSERT_TRUE(id.ok()) << id.status();
      index[*id] = submitted++;
    }
    auto report = engine.Step();
    ASSERT_TRUE(report.ok()) << report.status();
    max_running = std::max(max_running, engine.num_running());
    for (const auto& u : report->updates) {
      const size_t i = index.at(u.id);
      got[i].insert(got[i].end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.finished) done[i] = true;
    }
    ++steps;
  }
  EXPECT_EQ(got, plain);
  EXPECT_LE(max_running, 4);
  for (bool d : done) EXPECT_TRUE(d);
  EXPECT_EQ(target_->kv_stats().free_blocks, target_->kv_stats().num_blocks);
}

TEST_F(SpecEngineTest, InvalidTreesAreDroppedWithAClearErrorAndOthersUnaffected) {
  const auto requests = Prompts(6, 8, 11);
  const auto plain = Plain(requests);
  SpecEngine engine(target_.get());
  ASSERT_TRUE(engine
                  .AddDrafter(std::make_unique<ScriptedDrafter>(
                      "bad", ScriptedDrafter::Kind::kBadTree, References(requests, plain), 64))
                  .ok());
  ASSERT_TRUE(engine
                  .AddDrafter(std::make_unique<ScriptedDrafter>(
                      "oracle", ScriptedDrafter::Kind::kOracle, References(requests, plain), 64))
                  .ok());
  auto spec = WithDrafter(requests, "bad", 4);
  spec[0].speculation.drafter = "oracle";
  auto results = GenerateAll(engine, spec);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(Tokens(*results), plain);
  EXPECT_EQ((*results)[0].stats.draft_errors, 0);
  EXPECT_GT((*results)[0].stats.accepted_tokens, 0);
  std::set<std::string> kinds;
  for (size_t i = 1; i < results->size(); ++i) {
    const auto& st = (*results)[i].stats;
    EXPECT_EQ(st.draft_errors, st.steps - 1);  // the last step has nothing to draft
    EXPECT_EQ(st.accepted_tokens, 0);
    EXPECT_THAT(st.last_draft_error, HasSubstr("drafter 'bad'"));
    if (st.last_draft_error.find("vocabulary") != std::string::npos) kinds.insert("oov");
    if (st.last_draft_error.find("budget") != std::string::npos) kinds.insert("budget");
    if (st.last_draft_error.find("precede") != std::string::npos) kinds.insert("order");
  }
  EXPECT_EQ(kinds.size(), 3u) << "every kind of bad tree was seen";
}

TEST_F(SpecEngineTest, DrafterFailuresFallBackToPlainDecoding) {
  const auto requests = Prompts(4, 10, 13);
  const auto plain = Plain(requests);
  for (bool fail_observe : {false, true}) {
    SpecEngine engine(target_.get());
    auto drafter = std::make_unique<ScriptedDrafter>("oracle", ScriptedDrafter::Kind::kOracle,
                                                     References(requests, plain), 64);
    drafter->fail_propose = !fail_observe;
    drafter->fail_observe = fail_observe;
    ScriptedDrafter* raw = drafter.get();
    ASSERT_TRUE(engine.AddDrafter(std::move(drafter)).ok());
    auto results = GenerateAll(engine, WithDrafter(requests, "oracle", 4));
    ASSERT_TRUE(results.ok()) << results.status();
    EXPECT_EQ(Tokens(*results), plain);
    for (const auto& r : *results) {
      EXPECT_GT(r.stats.draft_errors, 0);
      EXPECT_THAT(r.stats.last_draft_error, HasSubstr("scripted"));
    }
    EXPECT_EQ(raw->released, 4) << "every drafter sequence is released exactly once";
  }
}

TEST_F(SpecEngineTest, DrafterExceptionsFallBackToPlainDecoding) {
  // A LibTorch error in Propose and bad_alloc in Observe stop at the engine (issue 19.2).
  const auto requests = Prompts(4, 10, 43);
  const auto plain = Plain(requests);
  for (bool in_observe : {false, true}) {
    SpecEngine engine(target_.get());
    auto drafter = std::make_unique<ScriptedDrafter>("oracle", ScriptedDrafter::Kind::kOracle,
                                                     References(requests, plain), 64);
    drafter->throw_propose = !in_observe;
    drafter->throw_observe = in_observe;
    ASSERT_TRUE(engine.AddDrafter(std::move(drafter)).ok());
    auto results = GenerateAll(engine, WithDrafter(requests, "oracle", 4));
    ASSERT_TRUE(results.ok()) << results.status();
    EXPECT_EQ(Tokens(*results), plain);
    for (const auto& r : *results) {
      EXPECT_GT(r.stats.draft_errors, 0);
      EXPECT_THAT(r.stats.last_draft_error, HasSubstr("INTERNAL"));
      EXPECT_THAT(r.stats.last_draft_error, HasSubstr(in_observe ? "Observe" : "Propose"));
    }
    EXPECT_EQ(target_->kv_stats().free_blocks, target_->kv_stats().num_blocks);
  }
}

TEST_F(SpecEngineTest, AFailingObserveOrProposeOfOneSequenceCostsOnlyItsDraft) {
  // Issue 19: one sequence's failure (a full drafter cache) made the whole batched call fail, and
  // every sequence in it lost speculation. Each sequence of a failed call is retried alone.
  const auto requests = Prompts(4, 12, 59);
  const auto plain = Plain(requests);
  for (bool in_observe : {true, false}) {
    SpecEngine engine(target_.get());
    auto drafter = std::make_unique<ScriptedDrafter>("oracle", ScriptedDrafter::Kind::kOracle,
                                                     References(requests, plain), 64);
    (in_observe ? drafter->refuse_observe_nth : drafter->refuse_propose_nth).insert(1);
    ASSERT_TRUE(engine.AddDrafter(std::move(drafter)).ok());
    auto results = GenerateAll(engine, WithDrafter(requests, "oracle", 4));
    ASSERT_TRUE(results.ok()) << results.status();
    EXPECT_EQ(Tokens(*results), plain);
    for (size_t i = 0; i < requests.size(); ++i) {
      const SpecRequestStats& st = (*results)[i].stats;
      if (i == 1) {
        EXPECT_GT(st.draft_errors, 0);
        EXPECT_THAT(st.last_draft_error, HasSubstr(in_observe ? "RESOURCE_EXHAUSTED" : "refusal"));
      } else {
        EXPECT_EQ(st.draft_errors, 0) << i << ": " << st.last_draft_error;
        EXPECT_GT(st.accepted_tokens, 0) << i;
      }
    }
    EXPECT_EQ(target_->kv_stats().free_blocks, target_->kv_stats().num_blocks);
  }
}

TEST_F(SpecEngineTest, DrafterCacheIsReservedAtAdmission) {
  // A drafter with a bounded cache (Drafter::capacity) is attached only to sequences whose worst
  // case fits next to the others'; the rest run without speculation and lose nothing else.
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r;
    for (int j = 0; j < 11; ++j) r.prompt.push_back((i * 13 + j * 7) % 64);
    r.max_new_tokens = 9;  // 20 positions, 19 cached by the drafter: 5 blocks of 4
    requests.push_back(r);
  }
  const auto plain = Plain(requests);
  SpecEngine engine(target_.get());
  auto drafter = std::make_unique<ScriptedDrafter>("oracle", ScriptedDrafter::Kind::kOracle,
                                                   References(requests, plain), 64);
  drafter->cap = {.blocks = 10, .block_size = 4};  // two such sequences at a time
  ASSERT_TRUE(engine.AddDrafter(std::move(drafter)).ok());
  auto results = GenerateAll(engine, WithDrafter(requests, "oracle", 4));
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(Tokens(*results), plain);
  for (size_t i = 0; i < requests.size(); ++i) {
    const SpecRequestStats& st = (*results)[i].stats;
    if (i < 2) {
      EXPECT_EQ(st.draft_errors, 0) << i << ": " << st.last_draft_error;
      EXPECT_GT(st.accepted_tokens, 0) << i;
    } else {
      EXPECT_EQ(st.draft_errors, 1) << i;
      EXPECT_THAT(st.last_draft_error,
                  HasSubstr("RESOURCE_EXHAUSTED: drafter 'oracle': the sequence needs 5 cache "
                            "blocks, 0 of 10 are free"));
      EXPECT_EQ(st.draft_tokens, 0) << i;
    }
  }
  // Finished sequences gave their blocks back: the next two draft again.
  auto again = GenerateAll(engine, WithDrafter({requests[2], requests[3]}, "oracle", 4));
  ASSERT_TRUE(again.ok()) << again.status();
  for (const auto& r : *again) {
    EXPECT_EQ(r.stats.draft_errors, 0) << r.stats.last_draft_error;
    EXPECT_GT(r.stats.accepted_tokens, 0);
  }
}

TEST(DrafterBlocksReservedTest, EveryPositionButThePendingOne) {
  const DrafterCapacity cap{.blocks = 100, .block_size = 4};
  EXPECT_EQ(DrafterBlocksReserved(1, cap), 0);
  EXPECT_EQ(DrafterBlocksReserved(5, cap), 1);
  EXPECT_EQ(DrafterBlocksReserved(6, cap), 2);
  EXPECT_EQ(DrafterBlocksReserved(1000, DrafterCapacity{}), 0) << "unbounded";
}

TEST_F(SpecEngineTest, TreesAtTheContextEdgeNeverFailTheStep) {
  // Issue 19.2: prompt + max_new_tokens == context with a wide tree: the tree's depth was bounded
  // by the room left but not its node count, so the forward overran the context and every
  // sequence in the step ended with OUT_OF_RANGE.
  auto requests = Prompts(8, 10, 47);
  requests[0].max_new_tokens = config_.max_position_embeddings - requests[0].prompt.size();
  const auto plain = Plain(requests);
  SpecEngine engine(target_.get());
  ASSERT_TRUE(engine
                  .AddDrafter(std::make_unique<ScriptedDrafter>(
                      "wide", ScriptedDrafter::Kind::kWideTree, References(requests, plain), 64))
                  .ok());
  auto spec = WithDrafter(requests, "none", 0);
  spec[0].speculation = {.drafter = "wide", .max_draft_tokens = 16};
  spec[3].speculation = {.drafter = "wide", .max_draft_tokens = 5};
  auto results = GenerateAll(engine, spec);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(Tokens(*results), plain);
  EXPECT_EQ((*results)[0].stats.draft_errors, 0) << (*results)[0].stats.last_draft_error;
  EXPECT_GT((*results)[0].stats.draft_tokens, 0);
  EXPECT_EQ(target_->kv_stats().free_blocks, target_->kv_stats().num_blocks);
}

TEST_F(SpecEngineTest, AForwardErrorNamingOneSequenceEndsOnlyThatRequest) {
  // The target refuses one sequence (here: its cache was released behind the engine's back, so
  // the forward fails NOT_FOUND naming it). Its draft is dropped, then the request ends with the
  // error; the others run again without it and are unaffected.
  const auto requests = Prompts(4, 12, 53);
  const auto plain = Plain(requests);
  SpecEngine engine(target_.get());
  ASSERT_TRUE(engine
                  .AddDrafter(std::make_unique<ScriptedDrafter>(
                      "oracle", ScriptedDrafter::Kind::kOracle, References(requests, plain), 64))
                  .ok());
  const SeqId victim = NewSequenceId() + 2;  // the second request's sequence
  std::vector<RequestId> ids;
  for (const auto& r : WithDrafter(requests, "oracle", 3)) ids.push_back(*engine.Submit(r));
  std::map<RequestId, std::vector<int32_t>> got;
  std::map<RequestId, RequestUpdate> last;
  for (int step = 0; engine.HasWork() && step < 100; ++step) {
    if (step == 2) {
      ASSERT_TRUE(target_->ReleaseSequence(victim).ok());
    }
    auto report = engine.Step();
    ASSERT_TRUE(report.ok()) << report.status();
    for (const auto& u : report->updates) {
      got[u.id].insert(got[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.finished) last[u.id] = u;
    }
  }
  ASSERT_EQ(last.size(), requests.size());
  EXPECT_EQ(last[ids[1]].finish_reason, FinishReason::kError);
  EXPECT_EQ(last[ids[1]].error.code(), StatusCode::kNotFound) << last[ids[1]].error;
  EXPECT_GT(last[ids[1]].stats.draft_errors, 0) << "the draft is dropped first";
  for (size_t i : {0, 2, 3}) {
    EXPECT_EQ(last[ids[i]].finish_reason, FinishReason::kLength) << i << ": " << last[ids[i]].error;
    EXPECT_EQ(got[ids[i]], plain[i]) << i;
    EXPECT_EQ(last[ids[i]].stats.draft_errors, 0) << i;
  }
  EXPECT_EQ(target_->kv_stats().free_blocks, target_->kv_stats().num_blocks);
}

TEST_F(SpecEngineTest, AnUnattributableForwardErrorDropsDraftsThenIsolatesSequences) {
  // The KV cache fills up behind the engine's back (RESOURCE_EXHAUSTED names no sequence): the
  // drafts go first, then each sequence runs alone, so only those that cannot get a block end.
  ModelRunnerOptions options;
  options.kv = {.block_size = 4, .num_blocks = 96};
  auto runner = ModelRunner::FromModule(target_->module(), options);
  ASSERT_TRUE(runner.ok()) << runner.status();
  ModelRunner& target = **runner;
  auto requests = Prompts(4, 12, 71);
  for (auto& r : requests) r.max_new_tokens = 12;
  const auto plain = Plain(requests);
  SpecEngine engine(&target);
  ASSERT_TRUE(engine
                  .AddDrafter(std::make_unique<ScriptedDrafter>(
                      "oracle", ScriptedDrafter::Kind::kOracle, References(requests, plain), 64))
                  .ok());
  std::vector<RequestId> ids;
  for (const auto& r : WithDrafter(requests, "oracle", 3)) ids.push_back(*engine.Submit(r));
  std::map<RequestId, std::vector<int32_t>> got;
  std::map<RequestId, RequestUpdate> last;
  std::vector<SeqId> hogs;
  for (int step = 0; engine.HasWork() && step < 100; ++step) {
    if (step == 2) {  // every free block but one goes to other users of the cache
      while (target.kv_stats().free_blocks > 1) {
        const int64_t n = std::min<int64_t>((target.kv_stats().free_blocks - 1) * 4, 120);
        hogs.push_back(NewSequenceId());
        ASSERT_TRUE(target.AddSequence(hogs.back()).ok());
        ASSERT_TRUE(
            target.Forward({.seqs = {{.seq = hogs.back(), .tokens = std::vector<int32_t>(n, 1)}}})
                .ok());
      }
    }
    auto report = engine.Step();
    ASSERT_TRUE(report.ok()) << report.status();
    for (const auto& u : report->updates) {
      got[u.id].insert(got[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.finished) last[u.id] = u;
    }
  }
  ASSERT_EQ(last.size(), requests.size());
  int completed = 0;
  bool kv_full_draft_error = false;
  for (size_t i = 0; i < ids.size(); ++i) {
    const RequestUpdate& u = last[ids[i]];
    kv_full_draft_error |= u.stats.last_draft_error.find("KV cache full") != std::string::npos;
    const std::vector<int32_t>& tokens = got[ids[i]];
    ASSERT_LE(tokens.size(), plain[i].size());
    EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), plain[i].begin())) << i;
    if (u.finish_reason == FinishReason::kLength) {
      EXPECT_EQ(tokens, plain[i]) << i;
      ++completed;
    } else {
      EXPECT_EQ(u.finish_reason, FinishReason::kError) << i;
      EXPECT_EQ(u.error.code(), StatusCode::kResourceExhausted) << i << ": " << u.error;
    }
  }
  EXPECT_TRUE(kv_full_draft_error) << "the drafts are dropped before any request ends";
  EXPECT_GE(completed, 1);
  for (SeqId h : hogs) ASSERT_TRUE(target.ReleaseSequence(h).ok());
  EXPECT_EQ(target.kv_stats().free_blocks, target.kv_stats().num_blocks);
}

TEST_F(SpecEngineTest, StopTokenInsideAcceptedDraftEndsTheOutput) {
  auto requests = Prompts(3, 30, 17);
  const auto unstopped = Plain(requests);
  for (size_t i = 0; i < requests.size(); ++i) requests[i].stop_token_ids = {unstopped[i][6]};
  const auto plain = Plain(requests);
  SpecEngine engine(target_.get());
  ASSERT_TRUE(
      engine
          .AddDrafter(std::make_unique<ScriptedDrafter>("oracle", ScriptedDrafter::Kind::kOracle,
                                                        References(requests, unstopped), 64))
          .ok());
  auto results = GenerateAll(engine, WithDrafter(requests, "oracle", 8));
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(Tokens(*results), plain);
  for (const auto& r : *results) EXPECT_EQ(r.result.finish_reason, FinishReason::kStop);
}

TEST_F(SpecEngineTest, CancelFreesKvBlocksAndLeavesOthersIntact) {
  const auto requests = Prompts(3, 30, 19);
  const auto plain = Plain(requests);
  SpecEngine engine(target_.get());
  ASSERT_TRUE(engine
                  .AddDrafter(std::make_unique<ScriptedDrafter>(
                      "oracle", ScriptedDrafter::Kind::kOracle, References(requests, plain), 64))
                  .ok());
  std::vector<RequestId> ids;
  for (const auto& r : WithDrafter(requests, "oracle", 2)) ids.push_back(*engine.Submit(r));
  std::map<RequestId, std::vector<int32_t>> got;
  std::map<RequestId, FinishReason> reasons;
  for (int step = 0; engine.HasWork(); ++step) {
    if (step == 2) {
      ASSERT_TRUE(engine.Cancel(ids[1]).ok());
    }
    auto report = engine.Step();
    ASSERT_TRUE(report.ok());
    for (const auto& u : report->updates) {
      got[u.id].insert(got[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.finished) reasons[u.id] = u.finish_reason;
    }
  }
  EXPECT_EQ(reasons[ids[1]], FinishReason::kCancelled);
  EXPECT_LT(got[ids[1]].size(), plain[1].size());
  EXPECT_EQ(got[ids[0]], plain[0]);
  EXPECT_EQ(got[ids[2]], plain[2]);
  EXPECT_EQ(engine.Cancel(ids[1]).code(), StatusCode::kNotFound);
  EXPECT_EQ(target_->kv_stats().free_blocks, target_->kv_stats().num_blocks);
}

TEST_F(SpecEngineTest, AFailedAdmissionEndsOnlyThatRequest) {
  // Submit takes the next process-wide sequence ids; occupying the second one in the target makes
  // that request's AddSequence fail in the middle of admission (issue 19.1: the failed request
  // was erased from the queue while the queue was being walked, so a later one was admitted
  // twice and a request was skipped).
  const auto requests = Prompts(5, 6, 37);
  const auto plain = Plain(requests);
  SpecEngine engine(target_.get());
  const SeqId taken = NewSequenceId() + 2;
  ASSERT_TRUE(target_->AddSequence(taken).ok());
  std::vector<RequestId> ids;
  for (const auto& r : WithDrafter(requests, "none", 0)) ids.push_back(*engine.Submit(r));
  std::map<RequestId, std::vector<int32_t>> got;
  std::map<RequestId, RequestUpdate> last;
  int steps = 0;
  while (engine.HasWork() && ++steps < 100) {
    auto report = engine.Step();
    ASSERT_TRUE(report.ok()) << report.status();
    for (const auto& u : report->updates) {
      got[u.id].insert(got[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.finished) last[u.id] = u;
    }
  }
  ASSERT_EQ(last.size(), requests.size());
  EXPECT_EQ(last[ids[1]].finish_reason, FinishReason::kError);
  EXPECT_EQ(last[ids[1]].error.code(), StatusCode::kAlreadyExists) << last[ids[1]].error;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i == 1) continue;
    EXPECT_EQ(last[ids[i]].finish_reason, FinishReason::kLength) << i << ": " << last[ids[i]].error;
    EXPECT_EQ(got[ids[i]], plain[i]) << i;
  }
  ASSERT_TRUE(target_->ReleaseSequence(taken).ok());
  EXPECT_EQ(target_->kv_stats().free_blocks, target_->kv_stats().num_blocks);
}

TEST_F(SpecEngineTest, CancellingWaitingRequestsLeavesTheQueueConsistent) {
  const auto requests = Prompts(6, 8, 41);
  const auto plain = Plain(requests);
  SpecEngine engine(target_.get(), {.max_batch_size = 1});
  std::vector<RequestId> ids;
  for (const auto& r : WithDrafter(requests, "none", 0)) ids.push_back(*engine.Submit(r));
  std::map<RequestId, std::vector<int32_t>> got;
  std::map<RequestId, FinishReason> reasons;
  for (int step = 0; engine.HasWork() && step < 200; ++step) {
    if (step == 1) {  // ids[0] runs; cancel queued ones, including the queue's head and tail
      for (size_t i : {1, 3, 5}) ASSERT_TRUE(engine.Cancel(ids[i]).ok());
    }
    auto report = engine.Step();
    ASSERT_TRUE(report.ok()) << report.status();
    for (const auto& u : report->updates) {
      got[u.id].insert(got[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
      if (u.finished) reasons[u.id] = u.finish_reason;
    }
    if (step == 1) {
      EXPECT_EQ(engine.num_waiting(), 2);
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i % 2) {
      EXPECT_EQ(reasons[ids[i]], FinishReason::kCancelled) << i;
      EXPECT_TRUE(got[ids[i]].empty()) << i;
    } else {
      EXPECT_EQ(reasons[ids[i]], FinishReason::kLength) << i;
      EXPECT_EQ(got[ids[i]], plain[i]) << i;
    }
  }
  EXPECT_EQ(target_->kv_stats().free_blocks, target_->kv_stats().num_blocks);
}

TEST_F(SpecEngineTest, AdmissionWaitsForKvMemory) {
  // 4 MB of KV holds few blocks: requests that do not fit wait in FIFO order, and all complete.
  const auto requests = Prompts(12, 100, 23);
  const auto plain = Plain(requests);
  SpecEngine engine(target_.get());
  auto results = GenerateAll(engine, WithDrafter(requests, "none", 0));
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(Tokens(*results), plain);
}

TEST_F(SpecEngineTest, RejectsBadRequestsNamingTheField) {
  SpecEngine engine(target_.get());
  ASSERT_TRUE(
      engine
          .AddDrafter(std::make_unique<ScriptedDrafter>("oracle", ScriptedDrafter::Kind::kOracle,
                                                        std::vector<std::vector<int32_t>>{}, 64))
          .ok());
  auto ok = WithDrafter(Prompts(1, 4), "oracle", 4)[0];
  auto expect = [&](SpecRequest r, StatusCode code, const std::string& text) {
    auto id = engine.Submit(r);
    ASSERT_FALSE(id.ok());
    EXPECT_EQ(id.status().code(), code);
    EXPECT_THAT(id.status().message(), HasSubstr(text));
  };
  auto r = ok;
  r.speculation.drafter = "medusa";
  expect(r, StatusCode::kInvalidArgument, "unknown drafter 'medusa'");
  r = ok;
  r.speculation.max_draft_tokens = -1;
  expect(r, StatusCode::kInvalidArgument, "max_draft_tokens");
  r = ok;
  r.speculation.verify.specdec_beta = 0;
  expect(r, StatusCode::kInvalidArgument, "beta");
  r = ok;
  r.generation.prompt = {};
  expect(r, StatusCode::kInvalidArgument, "prompt");
  r = ok;
  r.generation.prompt = {64};
  expect(r, StatusCode::kInvalidArgument, "vocabulary");
  r = ok;
  r.generation.max_new_tokens = 500;
  expect(r, StatusCode::kOutOfRange, "context");
  EXPECT_FALSE(engine.HasWork());
  EXPECT_EQ(
      engine
          .AddDrafter(std::make_unique<ScriptedDrafter>("oracle", ScriptedDrafter::Kind::kOracle,
                                                        std::vector<std::vector<int32_t>>{}, 64))
          .code(),
      StatusCode::kAlreadyExists);
}

TEST_F(SpecEngineTest, DraftersObserveTheTargetsHiddenStatesOfCommittedPositions) {
  // Also with chunked prefill (a step budget of 1 or 7 tokens): the drafter sees the same prompt
  // rows as after a one-shot prefill, and the final layer's states (hence the logits) match.
  // Both ways of keeping the rows: per-sequence buffers (the CPU's) and the shared row store (a
  // device's).
  for (const bool store : {false, true})
    for (int64_t max_step_tokens : {kDefaultMaxStepTokens, int64_t{7}, int64_t{1}}) {
      SCOPED_TRACE(testing::Message() << "store " << store << ", step tokens " << max_step_tokens);
      const auto requests = Prompts(4, 16, 31);
      const auto plain = Plain(requests);
      auto drafter = std::make_unique<HiddenRecordingDrafter>();
      HiddenRecordingDrafter* raw = drafter.get();
      SpecEngine engine(target_.get(),
                        {.max_step_tokens = max_step_tokens, .hidden_row_store_on_cpu = store});
      ASSERT_TRUE(engine.AddDrafter(std::move(drafter)).ok());
      auto results = GenerateAll(engine, WithDrafter(requests, "hidden", 3));
      ASSERT_TRUE(results.ok()) << results.status();
      EXPECT_EQ(Tokens(*results), plain);
      EXPECT_EQ(raw->finished_.size(), requests.size());
      for (int64_t at : ExpectObservedMatchesTarget(*raw, requests, plain)) EXPECT_LE(at, 0);
    }
}

TEST_F(SpecEngineTest, DeferredObservationCatchesUpBeforeTheNextDraft) {
  // A sequence at 0 nodes defers its drafter's Observe; when it drafts again the drafter catches
  // up on everything at once and sees exactly the target's tokens and hidden states.
  const auto requests = Prompts(3, 20, 41);
  const auto plain = Plain(requests);
  for (const bool store : {false, true}) {
    SCOPED_TRACE(testing::Message() << "store " << store);
    auto drafter = std::make_unique<HiddenRecordingDrafter>();
    HiddenRecordingDrafter* raw = drafter.get();
    SpecEngine engine(target_.get(), {.hidden_row_store_on_cpu = store});
    ASSERT_TRUE(engine.AddDrafter(std::move(drafter)).ok());
    const std::vector<RequestId> ids = SubmitAll(engine, WithDrafter(requests, "hidden", 3));
    ASSERT_EQ(ids.size(), requests.size());
    int64_t deferred = 0;
    auto out = StepWithBudgets(
        engine, ids, [](int step) { return step % 3 == 0 ? 3 : 0; },
        [&](int, const RequestUpdate& u) {
          if (!u.finished) deferred = std::max(deferred, u.unobserved_tokens);
        });
    for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(out[ids[i]], plain[i]) << i;
    EXPECT_GT(deferred, 1) << "some steps must have deferred their observation";
    EXPECT_EQ(raw->finished_.size(), requests.size());
    for (int64_t at : ExpectObservedMatchesTarget(*raw, requests, plain)) EXPECT_LE(at, 0);
  }
}

TEST_F(SpecEngineTest, LongDeferredObservationDetachesAHiddenStateDrafter) {
  // Without a drafter_context, past max_deferred_observation generated tokens at 0 nodes, a
  // drafter of hidden states is released from the sequence (speculation off for the rest of it);
  // the output is unchanged.
  const auto requests = Prompts(2, 30, 43);
  const auto plain = Plain(requests);
  for (const bool store : {false, true}) {
    SCOPED_TRACE(testing::Message() << "store " << store);
    auto drafter = std::make_unique<HiddenRecordingDrafter>();
    HiddenRecordingDrafter* raw = drafter.get();
    SpecEngine engine(
        target_.get(),
        {.max_deferred_observation = 5, .drafter_context = 0, .hidden_row_store_on_cpu = store});
    ASSERT_TRUE(engine.AddDrafter(std::move(drafter)).ok());
    const std::vector<RequestId> ids = SubmitAll(engine, WithDrafter(requests, "hidden", 3));
    ASSERT_EQ(ids.size(), requests.size());
    std::map<RequestId, std::vector<int32_t>> out;
    std::map<RequestId, int32_t> room;
    while (engine.HasWork()) {
      for (RequestId id : ids) (void)engine.SetDraftBudget(id, 0);
      auto report = engine.Step();
      ASSERT_TRUE(report.ok()) << report.status();
      for (const RequestUpdate& u : report->updates) {
        out[u.id].insert(out[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
        EXPECT_LE(u.unobserved_tokens, static_cast<int64_t>(requests[0].prompt.size() +
                                                            requests[1].prompt.size() + 5 + 2));
        if (!u.finished) room[u.id] = u.max_draft_nodes;
        EXPECT_EQ(u.draft_nodes, 0);
      }
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(out[ids[i]], plain[i]) << i;
      EXPECT_EQ(room[ids[i]], 0) << "detached: no draft room left";
    }
    // Released at detach time, having observed nothing.
    ASSERT_EQ(raw->finished_.size(), 2u);
    for (const auto& seen : raw->finished_) EXPECT_TRUE(seen.tokens.empty());
  }
}

TEST_F(SpecEngineTest, ADrafterContextRestartsIdleHiddenStateDraftersFromRecentTokens) {
  // With drafter_context 4, a catch-up longer than 4 tokens restarts the drafter from the last 4
  // (released, re-added, a first Observe of 4 tokens and 3 rows), and an idle backlog never
  // passes 8: no sequence is detached (max_deferred_observation 5 would have), each drafter epoch
  // observes a contiguous run of the sequence with the target's states of those positions, and
  // the output is unchanged. Only the prompt's last 3 states are kept (the drafter starts from its
  // last 4 tokens), also when the prompt is prefilled in chunks of a few tokens.
  const int64_t keep = 4;
  const auto requests = Prompts(3, 40, 47);
  const auto plain = Plain(requests);
  const std::vector<std::pair<bool, int64_t>> configs = {
      {false, kDefaultMaxStepTokens}, {true, kDefaultMaxStepTokens}, {false, 5}};
  for (const auto& [store, step_tokens] : configs) {
    SCOPED_TRACE(testing::Message() << "store " << store << ", step tokens " << step_tokens);
    auto drafter = std::make_unique<HiddenRecordingDrafter>();
    HiddenRecordingDrafter* raw = drafter.get();
    SpecEngine engine(target_.get(), {.max_step_tokens = step_tokens,
                                      .max_deferred_observation = 5,
                                      .drafter_context = keep,
                                      .hidden_row_store_on_cpu = store});
    ASSERT_TRUE(engine.AddDrafter(std::move(drafter)).ok());
    const std::vector<RequestId> ids = SubmitAll(engine, WithDrafter(requests, "hidden", 3));
    ASSERT_EQ(ids.size(), requests.size());
    // Drafts after an idle stretch of 12 steps (past max_deferred_observation): not detached.
    std::map<RequestId, int> late_drafts;
    auto out = StepWithBudgets(
        engine, ids, [](int step) { return step % 13 == 12 ? 3 : 0; },
        [&](int step, const RequestUpdate& u) {
          EXPECT_EQ(u.stats.draft_errors, 0);
          if (u.finished) return;
          EXPECT_LE(u.unobserved_tokens, keep);  // what the next catch-up observes
          if (u.draft_nodes > 0 && step > 13) ++late_drafts[u.id];
        });
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(out[ids[i]], plain[i]) << i;
      EXPECT_GT(late_drafts[ids[i]], 0) << i;
    }
    // Several epochs per sequence, each starting with at most the last 4 tokens.
    EXPECT_GT(raw->finished_.size(), 2 * requests.size());
    const std::vector<int64_t> offsets = ExpectObservedMatchesTarget(*raw, requests, plain);
    for (size_t e = 0; e < offsets.size(); ++e) {
      EXPECT_LE(raw->finished_[e].first_tokens, keep);
      if (offsets[e] > 0) EXPECT_EQ(raw->finished_[e].first_tokens, keep) << "a restart";
    }
  }
}

TEST_F(SpecEngineTest, QuietStepsSkipTheStatesADrafterWillNotRead) {
  // The plan promises each sequence no budget until its next draft (every 20th step): with
  // drafter_context 4, the steps more than 5 before a draft neither capture nor keep its states
  // (what its next catch-up would observe drops to the pending token), and the steps after them
  // keep enough that every draft after the first starts its drafter from the last 4 tokens, with
  // the target's states of those positions. The output is unchanged.
  const int64_t keep = 4;
  const int period = 20;
  const auto requests = Prompts(3, 70, 59);
  const auto plain = Plain(requests);
  for (const bool store : {false, true}) {
    SCOPED_TRACE(testing::Message() << "store " << store);
    auto drafter = std::make_unique<HiddenRecordingDrafter>();
    HiddenRecordingDrafter* raw = drafter.get();
    SpecEngine engine(target_.get(), {.drafter_context = keep, .hidden_row_store_on_cpu = store});
    ASSERT_TRUE(engine.AddDrafter(std::move(drafter)).ok());
    const std::vector<RequestId> ids = SubmitAll(engine, WithDrafter(requests, "hidden", 3));
    ASSERT_EQ(ids.size(), requests.size());
    std::map<RequestId, std::vector<int32_t>> out;
    std::map<RequestId, int> skipped, drafted;
    for (int step = 0; engine.HasWork(); ++step) {
      const int to_draft = period - 1 - step % period;  // steps until the next draft
      for (RequestId id : ids) {
        (void)engine.SetDraftBudget(id, to_draft == 0 ? 3 : 0, 0, 0, to_draft);
      }
      auto report = engine.Step();
      ASSERT_TRUE(report.ok()) << report.status();
      for (const RequestUpdate& u : report->updates) {
        out[u.id].insert(out[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
        EXPECT_EQ(u.stats.draft_errors, 0);
        if (u.finished || step < 2) continue;  // the prompt's step and the first decode
        if (u.draft_nodes > 0) ++drafted[u.id];
        if (to_draft > keep + 1) {
          EXPECT_EQ(u.unobserved_tokens, 1) << "step " << step;
          ++skipped[u.id];
        } else if (to_draft > 0 && to_draft <= keep - 1) {
          // Kept again from to_draft == keep + 1 on: at least two tokens by now.
          EXPECT_GE(u.unobserved_tokens, 2) << "step " << step;
        }
      }
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(out[ids[i]], plain[i]) << i;
      EXPECT_GT(skipped[ids[i]], 2 * (period - keep - 3)) << i;
      EXPECT_GE(drafted[ids[i]], 2) << i;
    }
    // One drafter epoch per draft (each restarts after the skipped states), each but a
    // sequence's first observing exactly its last 4 tokens, rows matching the target's.
    EXPECT_GT(raw->finished_.size(), 2 * requests.size());
    const std::vector<int64_t> offsets = ExpectObservedMatchesTarget(*raw, requests, plain);
    for (size_t e = 0; e < offsets.size(); ++e) {
      if (offsets[e] > 0) EXPECT_EQ(raw->finished_[e].first_tokens, keep) << e;
    }
  }
}

TEST_F(SpecEngineTest, ABrokenQuietPromiseDraftsFromTheStatesItKept) {
  // The plan promises 100 quiet steps every step it gives no budget, and gives a budget three
  // steps in every 13: the first of them finds only the pending token (no draft), the next two
  // draft from what was kept since. Draft quality only: the output is unchanged and every drafter
  // epoch observes a contiguous run with the target's states.
  const int64_t keep = 4;
  const auto requests = Prompts(2, 40, 61);
  const auto plain = Plain(requests);
  auto drafter = std::make_unique<HiddenRecordingDrafter>();
  HiddenRecordingDrafter* raw = drafter.get();
  SpecEngine engine(target_.get(), {.drafter_context = keep});
  ASSERT_TRUE(engine.AddDrafter(std::move(drafter)).ok());
  const std::vector<RequestId> ids = SubmitAll(engine, WithDrafter(requests, "hidden", 3));
  std::map<RequestId, std::vector<int32_t>> out;
  std::map<RequestId, int> drafted;
  for (int step = 0; engine.HasWork(); ++step) {
    const bool budget = step % 13 >= 10;
    for (RequestId id : ids) {
      (void)engine.SetDraftBudget(id, budget ? 3 : 0, 0, 0, budget ? 0 : 100);
    }
    auto report = engine.Step();
    ASSERT_TRUE(report.ok()) << report.status();
    for (const RequestUpdate& u : report->updates) {
      out[u.id].insert(out[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
      EXPECT_EQ(u.stats.draft_errors, 0);
      if (step % 13 == 10 && step > 13) EXPECT_EQ(u.draft_nodes, 0) << "step " << step;
      if (u.draft_nodes > 0) ++drafted[u.id];
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(out[ids[i]], plain[i]) << i;
    EXPECT_GE(drafted[ids[i]], 2) << i;
  }
  const std::vector<int64_t> offsets = ExpectObservedMatchesTarget(*raw, requests, plain);
  for (size_t e = 0; e < offsets.size(); ++e) {
    if (offsets[e] > 0) EXPECT_EQ(raw->finished_[e].first_tokens, 2) << e;
  }
}

TEST_F(SpecEngineTest, ADrafterThatCannotRestartASequenceEndsOnlyItsSpeculation) {
  // The drafter refuses the re-add of a restart (drafter_context 4): that sequence goes on
  // without speculation, with the drafter's error counted, and its output is unchanged.
  const auto requests = Prompts(3, 30, 53);
  const auto plain = Plain(requests);
  auto drafter = std::make_unique<HiddenRecordingDrafter>();
  drafter->refuse_re_adds = true;
  SpecEngine engine(target_.get(), {.drafter_context = 4});
  ASSERT_TRUE(engine.AddDrafter(std::move(drafter)).ok());
  const std::vector<RequestId> ids = SubmitAll(engine, WithDrafter(requests, "hidden", 3));
  ASSERT_EQ(ids.size(), requests.size());
  std::map<RequestId, SpecRequestStats> stats;
  auto out = StepWithBudgets(
      engine, ids, [](int step) { return step % 13 == 12 ? 3 : 0; },
      [&](int, const RequestUpdate& u) { stats[u.id] = u.stats; });
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(out[ids[i]], plain[i]) << i;
    EXPECT_EQ(stats[ids[i]].draft_errors, 1) << i;
    EXPECT_NE(stats[ids[i]].last_draft_error.find("re-add refused"), std::string::npos)
        << stats[ids[i]].last_draft_error;
  }
}

TEST_F(SpecEngineTest, AdaptiveBudgetsKeepGreedyOutputAndRespectCaps) {
  const auto requests = Prompts(8, 24, 5);
  const auto plain = Plain(requests);
  for (auto kind : {ScriptedDrafter::Kind::kOracle, ScriptedDrafter::Kind::kRandomTree}) {
    SCOPED_TRACE(static_cast<int>(kind));
    SpecEngine engine(target_.get());
    ASSERT_TRUE(engine
                    .AddDrafter(std::make_unique<ScriptedDrafter>("d", kind,
                                                                  References(requests, plain), 64))
                    .ok());
    BudgetPlanner planner(
        {.probe_after = 4, .probe_nodes = 2, .explore_every = 3, .exploration_share = 0.5},
        kDefaultMaxStepTokens);
    SpecRunStats run;
    auto results = GenerateAll(engine, WithDrafter(requests, "d", 6), nullptr, &run, &planner);
    ASSERT_TRUE(results.ok()) << results.status();
    EXPECT_EQ(Tokens(*results), plain);
    EXPECT_GT(run.budgeted_sequence_steps, 0);
    EXPECT_LE(run.budget_nodes, 6 * run.budgeted_sequence_steps);
    int64_t drafted = 0;
    for (const auto& r : *results) {
      EXPECT_LE(r.stats.draft_tokens, 6 * r.stats.draft_steps);
      EXPECT_EQ(r.stats.draft_errors, 0) << r.stats.last_draft_error;
      drafted += r.stats.draft_tokens;
    }
    EXPECT_GT(drafted, 0) << "the policy (or its exploration) must draft sometimes";
    EXPECT_EQ(target_->kv_stats().free_blocks, target_->kv_stats().num_blocks);
  }
}

TEST_F(SpecEngineTest, AdaptiveDraftsNeverDisplacePromptChunks) {
  // A small step budget (16 tokens) and 8 prompts of 30 tokens: the prompts are prefilled over
  // many steps while the first sequences decode. The policy's drafts fill only what the decodes
  // and the chunks leave, so no step exceeds the budget and prefill runs as without drafts.
  const auto requests = Prompts(8, 30, 77);
  const auto plain = Plain(requests);
  constexpr int64_t kBudget = 16;
  SpecEngine engine(target_.get(), {.max_step_tokens = kBudget});
  ASSERT_TRUE(engine
                  .AddDrafter(std::make_unique<ScriptedDrafter>("d", ScriptedDrafter::Kind::kOracle,
                                                                References(requests, plain), 64))
                  .ok());
  BudgetPlanner planner(
      {.probe_after = 2, .probe_nodes = 4, .explore_every = 1, .exploration_share = 1.0}, kBudget);
  SpecRunStats run;
  auto results = GenerateAll(engine, WithDrafter(requests, "d", 8), nullptr, &run, &planner);
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(Tokens(*results), plain);
  EXPECT_LE(run.peak_step_tokens, kBudget);
  int64_t drafted = 0;
  for (const auto& r : *results) drafted += r.stats.draft_tokens;
  EXPECT_GT(drafted, 0) << "drafts fill the room the budget leaves";
}

TEST_F(SpecEngineTest, ChunkedPrefillGivesTheOneShotLogits) {
  // The target appends a prompt chunk by chunk (no logits until the last chunk) and ends with the
  // logits of a one-shot prefill, within fp32 rounding.
  std::vector<int32_t> prompt;
  for (int i = 0; i < 45; ++i) prompt.push_back((i * 13 + 5) % 64);
  const SeqId whole = NewSequenceId(), chunked = NewSequenceId();
  ASSERT_TRUE(target_->AddSequence(whole).ok());
  ASSERT_TRUE(target_->AddSequence(chunked).ok());
  auto one_shot = target_->Forward({.seqs = {{.seq = whole, .tokens = prompt}}});
  ASSERT_TRUE(one_shot.ok()) << one_shot.status();
  at::Tensor last;
  for (size_t begin = 0; begin < prompt.size(); begin += 16) {
    const size_t end = std::min(prompt.size(), begin + 16);
    auto out = target_->Forward(
        {.seqs = {{.seq = chunked,
                   .tokens = std::vector<int32_t>(prompt.begin() + begin, prompt.begin() + end),
                   .logits = end == prompt.size() ? LogitsRows::kLast : LogitsRows::kNone}}});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->logits.size(0), end == prompt.size() ? 1 : 0);
    last = out->logits;
  }
  // The 45-row forward runs its projections through sgemm and the 16-row chunks through the
  // engine's small-row kernel, so the two differ by their summation order and FMA use: measured
  // 6e-6 of the scale with the AVX-512 kernels, 2.2e-5 with the baseline x86-64 ones (the TSan
  // build). A chunking bug (positions, mask, cache) moves logits by a good part of the scale.
  const float scale = one_shot->logits.abs().max().item<float>();
  EXPECT_LT((last - one_shot->logits).abs().max().item<float>(), 1e-4f * scale);
  EXPECT_EQ(last.argmax(-1).item<int64_t>(), one_shot->logits.argmax(-1).item<int64_t>());
  ASSERT_TRUE(target_->ReleaseSequence(whole).ok());
  ASSERT_TRUE(target_->ReleaseSequence(chunked).ok());
}

TEST_F(SpecEngineTest, ChunkedPrefillKeepsGreedyOutputForEveryBudget) {
  const auto requests = Prompts(6, 12, 61);
  const auto plain = Plain(requests);
  for (int64_t max_step_tokens : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{16}}) {
    SpecEngine engine(target_.get(), {.max_step_tokens = max_step_tokens});
    ASSERT_TRUE(
        engine
            .AddDrafter(std::make_unique<ScriptedDrafter>(
                "random", ScriptedDrafter::Kind::kRandomTree, References(requests, plain), 64))
            .ok());
    auto spec = WithDrafter(requests, "random", 4);
    spec[0].speculation.drafter = "none";
    SpecRunStats run;
    auto results = GenerateAll(engine, spec, nullptr, &run);
    ASSERT_TRUE(results.ok()) << results.status();
    EXPECT_EQ(Tokens(*results), plain) << "max_step_tokens " << max_step_tokens;
    EXPECT_EQ(target_->kv_stats().free_blocks, target_->kv_stats().num_blocks);
  }
}

TEST_F(SpecEngineTest, LongPromptIsPrefilledInChunksWhileRunningSequencesDecode) {
  // Issue 13: with a step budget of 24 tokens, a 100-token prompt admitted among three running
  // decodes is prefilled over several steps, and the running sequences emit a token every step.
  auto requests = Prompts(3, 40, 67);
  for (auto& r : requests) r.max_new_tokens = 40;
  GenerationRequest long_prompt;
  for (int i = 0; i < 100; ++i) long_prompt.prompt.push_back((i * 29 + 3) % 64);
  long_prompt.max_new_tokens = 6;
  requests.push_back(long_prompt);
  const auto plain = Plain(requests);
  SpecEngine engine(target_.get(), {.max_step_tokens = 24});
  ASSERT_TRUE(engine
                  .AddDrafter(std::make_unique<ScriptedDrafter>(
                      "oracle", ScriptedDrafter::Kind::kOracle, References(requests, plain), 64))
                  .ok());
  auto spec = WithDrafter(requests, "none", 0);
  spec[1].speculation = {.drafter = "oracle", .max_draft_tokens = 3};
  std::vector<RequestId> ids;
  std::map<RequestId, std::vector<int32_t>> got;
  auto step = [&]() {
    auto report = engine.Step();
    EXPECT_TRUE(report.ok()) << report.status();
    for (const auto& u : report->updates) {
      got[u.id].insert(got[u.id].end(), u.new_tokens.begin(), u.new_tokens.end());
    }
    return *report;
  };
  for (size_t i = 0; i < 3; ++i) ids.push_back(*engine.Submit(spec[i]));
  // The three short prompts (up to 20 tokens each) take a few steps of 24 tokens.
  for (int i = 0; i < 10 && (got[ids[0]].empty() || got[ids[1]].empty() || got[ids[2]].empty());
       ++i) {
    step();
  }
  for (size_t i = 0; i < 3; ++i) ASSERT_FALSE(got[ids[i]].empty()) << i;
  ids.push_back(*engine.Submit(spec[3]));
  int prefill_steps = 0;
  int64_t prefilled = 0;
  while (got[ids[3]].empty()) {
    ASSERT_LT(prefill_steps, 50);
    const StepReport report = step();
    ++prefill_steps;
    // Decodes first (3 pending tokens + at most 3 draft nodes), the prompt gets the rest.
    EXPECT_GT(report.prefill_tokens, 0);
    EXPECT_LE(report.prefill_tokens + report.verify_tokens, 24);
    // The chunk's attention work, reported apart: its rows x the prompt's context after it.
    EXPECT_DOUBLE_EQ(report.prefill_attention,
                     static_cast<double>(report.prefill_tokens) *
                         static_cast<double>(prefilled + report.prefill_tokens));
    EXPECT_GT(report.attention, report.prefill_attention);
    prefilled += report.prefill_tokens;
    EXPECT_EQ(report.batch_size, 4);
    std::set<RequestId> emitted;
    for (const auto& u : report.updates) {
      if (!u.new_tokens.empty()) emitted.insert(u.id);
    }
    for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(emitted.count(ids[i])) << "step " << prefill_steps;
  }
  EXPECT_GE(prefill_steps, 100 / 24 + 1);
  while (engine.HasWork()) step();
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(got[ids[i]], plain[i]) << i;
  EXPECT_EQ(target_->kv_stats().free_blocks, target_->kv_stats().num_blocks);
}

TEST_F(SpecEngineTest, LossyVerificationChangesOutputOnlyWhenEnabled) {
  const auto requests = Prompts(8, 24, 29);
  const auto plain = Plain(requests);
  auto run = [&](VerifyParams verify) {
    SpecEngine engine(target_.get());
    EXPECT_TRUE(
        engine
            .AddDrafter(std::make_unique<ScriptedDrafter>(
                "random", ScriptedDrafter::Kind::kRandomTree, References(requests, plain), 64))
            .ok());
    auto spec = WithDrafter(requests, "random", 6);
    for (auto& r : spec) r.speculation.verify = verify;
    auto results = GenerateAll(engine, spec);
    EXPECT_TRUE(results.ok()) << results.status();
    return Tokens(*results);
  };
  EXPECT_EQ(run({}), plain);
  // Accept any draft token within the target's top 8 and 4 nats of its top-1: random drafts get in.
  EXPECT_NE(run({.mode = VerifyMode::kSpecDec, .specdec_beta = 8, .specdec_tau = 4.0f}), plain);
}

TEST_F(SpecEngineTest, TypicalAcceptanceIsLossyOnlyWhenEnabled) {
  const auto requests = Prompts(6, 24, 31);
  const auto plain = Plain(requests);
  auto run = [&](VerifyParams verify, float temperature) {
    SpecEngine engine(target_.get());
    EXPECT_TRUE(
        engine
            .AddDrafter(std::make_unique<ScriptedDrafter>(
                "random", ScriptedDrafter::Kind::kRandomTree, References(requests, plain), 64))
            .ok());
    auto spec = WithDrafter(requests, "random", 6);
    for (size_t i = 0; i < spec.size(); ++i) {
      spec[i].speculation.verify = verify;
      spec[i].generation.sampling.temperature = temperature;
      spec[i].generation.sampling.seed = 100 + i;
    }
    auto results = GenerateAll(engine, spec);
    EXPECT_TRUE(results.ok()) << results.status();
    int64_t accepted = 0;
    bool lossy = false;
    for (const auto& r : *results) {
      accepted += r.stats.accepted_tokens;
      lossy |= r.stats.lossy;
    }
    return std::make_tuple(Tokens(*results), accepted, lossy);
  };
  const VerifyParams typical{
      .mode = VerifyMode::kTypical, .typical_epsilon = 1e-6f, .typical_delta = 1e-6f};
  // Greedy requests keep the lossless greedy rule even when typical is asked for.
  EXPECT_EQ(std::get<0>(run(typical, 0.0f)), plain);
  // Sampled: a near-zero threshold lets random drafts in, which lossless rejection does not.
  const auto [lossless_tokens, lossless_accepted, lossless_lossy] = run({}, 1.0f);
  const auto [typical_tokens, typical_accepted, typical_lossy] = run(typical, 1.0f);
  EXPECT_FALSE(lossless_lossy);
  EXPECT_TRUE(typical_lossy);
  EXPECT_GT(typical_accepted, lossless_accepted);
  EXPECT_NE(typical_tokens, lossless_tokens);
}

TEST_F(SpecEngineTest, LossyVerificationIsLabelled) {
  const auto requests = Prompts(2, 6);
  const auto plain = Plain(requests);
  SpecEngine engine(target_.get());
  ASSERT_TRUE(engine
                  .AddDrafter(std::make_unique<ScriptedDrafter>(
                      "oracle", ScriptedDrafter::Kind::kOracle, References(requests, plain), 64))
                  .ok());
  auto spec = WithDrafter(requests, "oracle", 3);
  spec[1].speculation.verify.mode = VerifyMode::kSpecDec;
  auto results = GenerateAll(engine, spec);
  ASSERT_TRUE(results.ok());
  EXPECT_FALSE((*results)[0].stats.lossy);
  EXPECT_TRUE((*results)[1].stats.lossy);
}

// Issue 19.9: a request whose max_new_tokens fills the context (the API's default when unset)
// reserved its draft and one more position past the context, which no forward can reach.
TEST(KvBlocksReservedTest, NeverMoreThanTheContext) {
  SpecRequest r;
  r.generation.prompt.assign(10, 5);
  r.generation.max_new_tokens = 512 - 10;
  r.speculation.drafter = "ngram";
  r.speculation.max_draft_tokens = 4;
  EXPECT_EQ(KvBlocksReserved(r, 16, 512), 32);
  r.generation.max_new_tokens = 100;  // far from the context: prompt + max_new + draft + 1
  EXPECT_EQ(KvBlocksReserved(r, 16, 512), 8);
}

}  // namespace
}  // namespace specula
