// ParallelSpecDrafter on tiny random models, with and without target features: the real-row cache
// and the drafted distributions equal a from-scratch group-wise recompute (the trainer's forward)
// after ragged accept/reject rounds, row i drafts depth i + 1, every tree shape respects its
// budget, sampled chains carry their distributions. What every drafter must do (greedy equals
// plain decoding, bad input changes nothing, ...) is in drafter_conformance.cc.
#include "common/drafters/parallelspec/parallelspec_drafter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <random>

#include "common/drafters/parallelspec/parallelspec_model.h"
#include "common/engine/plain_decoder.h"
#include "common/model/rope.h"
#include "common/model/transformer.h"
#include "common/spec/spec_engine.h"
#include "tests/drafters/cpu_forward_checks.h"
#include "tests/testing/tiny_model.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kVocab = 64;
constexpr int64_t kMasks = 3;

std::shared_ptr<CausalLMImpl> TargetModule(uint64_t seed = 3) {
  return MakeTinyModel(TinyModelConfig(), seed, /*weight_scale=*/4.0);
}

std::unique_ptr<ModelRunner> Runner(std::shared_ptr<CausalLMImpl> module) {
  ModelRunnerOptions o;
  o.kv.block_size = 4;
  o.kv.num_blocks = 512;
  auto runner = ModelRunner::FromModule(std::move(module), o);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? std::move(*runner) : nullptr;
}

std::shared_ptr<ParallelSpecImpl> PsModule(bool features, uint64_t seed = 5) {
  ParallelSpecConfig c = ParallelSpecConfig::ForTarget(TinyModelConfig(), kMasks);
  c.use_target_features = features;
  auto m = std::make_shared<ParallelSpecImpl>(c, TinyModelConfig());
  m->InitWeights(seed);
  torch::NoGradGuard no_grad;
  // Larger weights: sharper, more varied distributions than the 0.02 init gives.
  for (auto& p : m->named_parameters()) {
    if (p.key().find("norm") == std::string::npos) p.value().mul_(10.0);
  }
  return m;
}

std::unique_ptr<ParallelSpecDrafter> Drafter(const ModelRunner& target, bool features,
                                             ParallelSpecDrafterOptions options = {},
                                             uint64_t seed = 5) {
  options.kv = {.block_size = 4, .num_blocks = 256};
  auto d = ParallelSpecDrafter::Create(PsModule(features, seed), target, std::move(options));
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

std::vector<int32_t> RandomTokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % kVocab);
  return t;
}

// The target's hidden states of `layers` for `tokens` from one dense causal forward: [n, d] each.
std::vector<torch::Tensor> DenseHidden(CausalLMImpl& target, const std::vector<int32_t>& tokens,
                                       const std::vector<int64_t>& layers) {
  torch::NoGradGuard no_grad;
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (layers.empty()) return {};
  auto ids = torch::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()), torch::kLong);
  auto in = target.DenseCausalInputs(1, n, torch::arange(n, torch::kLong));
  return target.forward(ids, in, nullptr, layers).hidden_states;
}

// From scratch, for a sequence whose tokens are `tokens` (the last one pending): the real rows'
// keys/values [n, nkv, hd] (n = tokens - 1) and the logits [1 + k, V] of the last group, through
// the trainer's group-wise forward.
struct Recomputed {
  torch::Tensor keys, values, logits;
};
Recomputed Recompute(ParallelSpecImpl& m, CausalLMImpl& target,
                     const std::vector<int32_t>& tokens) {
  torch::NoGradGuard no_grad;
  const ParallelSpecConfig& c = m.config();
  const int64_t n = static_cast<int64_t>(tokens.size()) - 1;
  torch::Tensor f = torch::zeros({n, c.target.hidden_size});
  if (c.use_target_features) {
    f = DenseHidden(target, {tokens.begin(), tokens.end() - 1}, {c.feature_layer})[0];
  }
  auto next = torch::tensor(std::vector<int64_t>(tokens.begin() + 1, tokens.end()), torch::kLong);
  auto x = m.RealInputs(f, next);  // [n, d]
  auto normed = m.layer->input_layernorm(x);
  auto cs = m.RopeFor(torch::arange(n, torch::kLong));
  Recomputed r;
  r.keys =
      ApplyRope(m.layer->self_attn->k_proj(normed).view({n, c.num_key_value_heads, c.head_dim}),
                cs.first, cs.second);
  r.values = m.layer->self_attn->v_proj(normed).view({n, c.num_key_value_heads, c.head_dim});
  auto out = m.GroupForward(x.view({1, n, -1}), torch::full({1, 1}, n - 1, torch::kLong),
                            torch::ones({1, 1}, torch::kBool));
  auto rows = torch::cat({out.real[0].narrow(0, n - 1, 1), out.masks[0][0]}, 0);  // [1 + k, d]
  r.logits = m.Logits(rows).to(torch::kFloat);
  return r;
}

void ExpectMatchesRecompute(ParallelSpecDrafter& d, CausalLMImpl& target, SeqId seq,
                            const std::string& what) {
  auto tokens = d.Tokens(seq);
  ASSERT_TRUE(tokens.ok());
  if (tokens->size() < 2) return;  // nothing committed yet
  auto cache = d.RealCache(seq);
  ASSERT_TRUE(cache.ok());
  ASSERT_EQ(cache->first.size(0), static_cast<int64_t>(tokens->size()) - 1) << what;
  Recomputed r = Recompute(*d.module(), target, *tokens);
  EXPECT_TRUE(torch::allclose(cache->first, r.keys, 1e-4, 1e-4)) << what << ": keys differ";
  EXPECT_TRUE(torch::allclose(cache->second, r.values, 1e-4, 1e-4)) << what << ": values differ";
  auto logits = d.DepthLogitsOf(seq);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_TRUE(torch::allclose(*logits, r.logits, 1e-3, 1e-3))
      << what << ": serving logits differ from the group-wise (training) forward";
  // Drafting left the cache as it was.
  EXPECT_EQ(d.RealCache(seq)->first.size(0), cache->first.size(0));
}

// Drives the drafter as the engine does: prefill, then rounds that append "accepted drafts +
// bonus" of random lengths, checking cache and distributions against a recompute every round.
TEST(ParallelSpecDrafterTest, CacheEqualsRecomputeUnderRaggedAcceptance) {
  for (bool features : {true, false}) {
    auto target_module = TargetModule();
    auto target = Runner(target_module);
    auto d = Drafter(*target, features);
    const std::vector<int32_t> tokens = RandomTokens(60, 11);
    const auto layers = d->hidden_layers();
    ASSERT_EQ(layers.size(), features ? 1u : 0u);
    const auto hidden = DenseHidden(*target_module, tokens, layers);
    auto rows = [&](int64_t from, int64_t n) {
      std::vector<at::Tensor> h;
      for (const auto& t : hidden) h.push_back(t.narrow(0, from, n));
      return h;
    };
    const std::vector<SeqId> seqs = {101, 102};
    for (SeqId s : seqs) ASSERT_TRUE(d->AddSequence(s, {}).ok());
    std::vector<int64_t> len = {10, 5};
    {
      std::vector<DrafterObservation> obs;
      for (size_t b = 0; b < seqs.size(); ++b) {
        obs.push_back({.seq = seqs[b],
                       .tokens = std::vector<int32_t>(tokens.begin(), tokens.begin() + len[b]),
                       .hidden = rows(0, len[b] - 1)});
      }
      ASSERT_TRUE(d->Observe(obs).ok());
    }
    for (SeqId s : seqs) ExpectMatchesRecompute(*d, *target_module, s, "after prefill");
    std::mt19937 rng(3);
    for (int round = 0; round < 8; ++round) {
      std::vector<DrafterObservation> obs;
      for (size_t b = 0; b < seqs.size(); ++b) {
        const int64_t added = rng() % 4 + 1;  // accepted drafts (0..3) + the bonus token
        obs.push_back({.seq = seqs[b],
                       .tokens = std::vector<int32_t>(tokens.begin() + len[b],
                                                      tokens.begin() + len[b] + added),
                       .hidden = rows(len[b] - 1, added)});
        len[b] += added;
      }
      ASSERT_TRUE(d->Observe(obs).ok());
      // A Propose in between must not disturb the cache.
      ASSERT_TRUE(d->Propose({{.seq = 101, .max_nodes = 6, .max_depth = 6},
                              {.seq = 102, .max_nodes = 2, .max_depth = 2}})
                      .ok());
      for (SeqId s : seqs) {
        ExpectMatchesRecompute(*d, *target_module, s,
                               StrCat(features ? "features" : "tokens", " round ", round));
      }
    }
  }
}

// The same through SpecEngine: what the engine hands over rebuilds exactly the recomputed cache.
TEST(ParallelSpecDrafterTest, EngineRoundsKeepCacheEqualToRecompute) {
  auto target_module = TargetModule();
  auto target = Runner(target_module);
  SpecEngine engine(target.get());
  ASSERT_TRUE(engine.AddDrafter(Drafter(*target, true)).ok());
  auto* d = static_cast<ParallelSpecDrafter*>(engine.drafter("parallelspec"));
  for (int i = 0; i < 3; ++i) {
    SpecRequest r;
    r.generation.prompt = RandomTokens(5 + 7 * i, 20 + i);
    r.generation.max_new_tokens = 60;
    r.speculation = {.drafter = "parallelspec", .max_draft_tokens = 6};
    ASSERT_TRUE(engine.Submit(r).ok());
  }
  int64_t drafted = 0, accepted = 0;
  for (int step = 0; step < 12; ++step) {
    auto report = engine.Step();
    ASSERT_TRUE(report.ok()) << report.status();
    for (const auto& u : report->updates) {
      ASSERT_FALSE(u.finished) << "a request finished early";
      EXPECT_EQ(u.stats.draft_errors, 0) << u.stats.last_draft_error;
      drafted = std::max(drafted, u.stats.draft_tokens);
      accepted = std::max(accepted, u.stats.accepted_tokens);
    }
    for (SeqId s : d->sequences()) {
      ExpectMatchesRecompute(*d, *target_module, s, "step " + std::to_string(step));
    }
  }
  EXPECT_GT(drafted, accepted) << "no draft was ever rejected";
}

// Observes 12 random tokens on sequence 1 of `d` (hidden states from `target`).
void ObservePrefix(ParallelSpecDrafter& d, const ModelRunner& target, uint32_t seed = 4) {
  const std::vector<int32_t> tokens = RandomTokens(12, seed);
  ASSERT_TRUE(
      d.Observe({{.seq = 1,
                  .tokens = tokens,
                  .hidden = DenseHidden(*target.module(), {tokens.begin(), tokens.end() - 1},
                                        d.hidden_layers())}})
          .ok());
}

TEST(ParallelSpecDrafterTest, ChainRowIDraftsDepthIPlus1WithinBudgets) {
  auto target = Runner(TargetModule());
  auto d = Drafter(*target, true, {.shape = ParallelSpecShape::kChain});
  ASSERT_TRUE(d->AddSequence(1, {}).ok());
  ObservePrefix(*d, *target);
  auto logits = d->DepthLogitsOf(1);
  ASSERT_TRUE(logits.ok());
  ASSERT_EQ(logits->size(0), kMasks + 1);
  auto trees = d->Propose({{.seq = 1, .max_nodes = 8, .max_depth = 8}});
  ASSERT_TRUE(trees.ok());
  const CandidateTree& chain = (*trees)[0];
  ASSERT_EQ(chain.size(), kMasks + 1);  // the chain is as long as the rows allow
  for (int32_t i = 0; i < chain.size(); ++i) {
    EXPECT_EQ(chain.parent(i), i - 1);
    auto row = (*logits)[i].contiguous();
    EXPECT_EQ(chain.token(i), row.argmax().item<int64_t>()) << "depth " << i + 1;
    EXPECT_NEAR(chain.draft_prob(i), torch::softmax(row, 0).max().item<float>(), 1e-5);
  }
  EXPECT_EQ((*d->Propose({{.seq = 1, .max_nodes = 2, .max_depth = 8}}))[0].size(), 2);
  EXPECT_EQ((*d->Propose({{.seq = 1, .max_nodes = 8, .max_depth = 3}}))[0].size(), 3);
  EXPECT_TRUE((*d->Propose({{.seq = 1, .max_nodes = 0, .max_depth = 3}}))[0].empty());
}

TEST(ParallelSpecDrafterTest, EveryShapeRespectsItsBudget) {
  auto target = Runner(TargetModule());
  auto tree =
      StaticDraftTree::FromJson("[[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]]", "tree.json");
  ASSERT_TRUE(tree.ok()) << tree.status();
  for (ParallelSpecShape shape : {ParallelSpecShape::kChain, ParallelSpecShape::kMarginalTree,
                                  ParallelSpecShape::kStaticTree}) {
    auto d = Drafter(*target, true, {.shape = shape, .static_tree = *tree});
    ASSERT_TRUE(d->AddSequence(1, {}).ok());
    ObservePrefix(*d, *target);
    for (int32_t depth : {1, 2, 3, 8}) {
      for (int32_t budget : {1, 2, 3, 6, 16}) {
        auto trees = d->Propose({{.seq = 1, .max_nodes = budget, .max_depth = depth}});
        ASSERT_TRUE(trees.ok());
        const CandidateTree& t = (*trees)[0];
        EXPECT_TRUE(t.Validate(kVocab, budget, depth).ok())
            << static_cast<int>(shape) << " " << budget << " " << depth;
        EXPECT_GT(t.size(), 0);
        if (shape == ParallelSpecShape::kMarginalTree) {
          EXPECT_EQ(t.size(), budget) << "the budgeted tree spends its budget";
        }
      }
    }
  }
}

// The autoregressive baseline drafts what the network would predict if each drafted token were
// committed with the network's own regressed feature: a second drafter that observes the drafted
// tokens one by one, each with the previous last row as its hidden state, drafts the same chain.
TEST(ParallelSpecDrafterTest, AutoregressiveChainFeedsBackItsOwnFeatures) {
  auto target = Runner(TargetModule());
  for (bool features : {true, false}) {
    auto ar = Drafter(*target, features, {.shape = ParallelSpecShape::kAutoregressive});
    auto replay = Drafter(*target, features, {.shape = ParallelSpecShape::kChain});
    ASSERT_TRUE(ar->AddSequence(1, {}).ok());
    ASSERT_TRUE(replay->AddSequence(1, {}).ok());
    ObservePrefix(*ar, *target);
    ObservePrefix(*replay, *target);
    const auto cache_before = ar->RealCache(1)->first.size(0);
    auto trees = ar->Propose({{.seq = 1, .max_nodes = 8, .max_depth = 8}});
    ASSERT_TRUE(trees.ok()) << trees.status();
    const CandidateTree& chain = (*trees)[0];
    ASSERT_EQ(chain.size(), kMasks + 1) << "as deep as the parallel shapes";
    EXPECT_EQ(ar->RealCache(1)->first.size(0), cache_before) << "drafted rows left the cache";
    for (int32_t i = 0; i < chain.size(); ++i) {
      EXPECT_EQ(chain.parent(i), i - 1);
      auto logits = replay->DepthLogitsOf(1);
      ASSERT_TRUE(logits.ok());
      EXPECT_EQ(logits->select(0, 0).argmax().item<int64_t>(), chain.token(i))
          << "features " << features << " depth " << i + 1;
      auto last = replay->LastRow(1);
      ASSERT_TRUE(last.ok());
      DrafterObservation o{.seq = 1, .tokens = {chain.token(i)}};
      if (features) o.hidden = {last->view({1, -1})};
      ASSERT_TRUE(replay->Observe({o}).ok());
    }
    // Budgets: never deeper or larger than asked.
    for (int32_t budget : {1, 2, 3}) {
      auto small = ar->Propose({{.seq = 1, .max_nodes = budget, .max_depth = 8}});
      ASSERT_TRUE(small.ok());
      EXPECT_EQ((*small)[0].size(), budget);
      EXPECT_EQ((*small)[0].tokens(),
                std::vector<int32_t>(chain.tokens().begin(), chain.tokens().begin() + budget));
    }
  }
}

TEST(ParallelSpecDrafterTest, StaticTreeFollowsItsRankPaths) {
  auto target = Runner(TargetModule());
  auto tree = StaticDraftTree::FromJson(R"({"paths": [[1], [0], [0, 0], [0, 2]]})", "tree.json");
  ASSERT_TRUE(tree.ok()) << tree.status();
  auto d = Drafter(*target, true, {.shape = ParallelSpecShape::kStaticTree, .static_tree = *tree});
  ASSERT_TRUE(d->AddSequence(1, {}).ok());
  ObservePrefix(*d, *target);
  auto logits = d->DepthLogitsOf(1);
  auto trees = d->Propose({{.seq = 1, .max_nodes = 8, .max_depth = 8}});
  ASSERT_TRUE(trees.ok());
  const CandidateTree& t = (*trees)[0];
  ASSERT_EQ(t.size(), 4);
  auto rank = [&](int64_t row, int64_t r) {
    return std::get<1>((*logits)[row].topk(3))[r].item<int64_t>();
  };
  EXPECT_EQ(t.token(0), rank(0, 1));
  EXPECT_EQ(t.token(1), rank(0, 0));
  EXPECT_EQ(t.parent(2), 1);
  EXPECT_EQ(t.token(2), rank(1, 0));
  EXPECT_EQ(t.token(3), rank(1, 2));
  for (int32_t i = 0; i < t.size(); ++i) EXPECT_EQ(t.proposal(i), -1) << "deterministic";

  for (const char* bad :
       {"[]", "[[0], [0]]", "[[0, 1]]", "[[-1]]", "{\"paths\": 3}", "[[0], []]", "not json"}) {
    auto s = StaticDraftTree::FromJson(bad, "tree.json");
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_THAT(s.status().message(), HasSubstr("tree.json")) << bad;
  }
  auto s = StaticDraftTree::FromJson("[[0, 1]]", "tree.json");
  EXPECT_THAT(s.status().message(), HasSubstr("[0, 1] has no parent"));
}

TEST(ParallelSpecDrafterTest, SampledChainsCarryTheShapedDistribution) {
  auto target = Runner(TargetModule());
  const SamplingParams sampling{.temperature = 0.8f, .top_k = 10, .seed = 3};
  for (bool features : {true, false}) {
    auto d = Drafter(*target, features, {.shape = ParallelSpecShape::kChain});
    ASSERT_TRUE(d->AddSequence(1, sampling).ok());
    ObservePrefix(*d, *target, 2);
    auto logits = d->DepthLogitsOf(1);
    auto trees = d->Propose({{.seq = 1, .max_nodes = 4, .max_depth = 4}});
    ASSERT_TRUE(trees.ok());
    const CandidateTree& t = (*trees)[0];
    ASSERT_TRUE(t.Validate(kVocab, 4, 4).ok());
    ASSERT_EQ(t.size(), 4);
    for (int32_t i = 0; i < t.size(); ++i) {
      ASSERT_GE(t.proposal(i), 0);
      auto row = (*logits)[i].contiguous();
      const std::vector<float> want =
          Probabilities({row.data_ptr<float>(), static_cast<size_t>(kVocab)}, sampling);
      auto got = t.distribution(t.proposal(i));
      for (int32_t v = 0; v < kVocab; ++v) EXPECT_NEAR(got[v], want[v], 1e-5);
      EXPECT_GT(want[t.token(i)], 0.0f);
    }
  }
}

TEST(ParallelSpecDrafterTest, OptionsTargetsAndCacheSize) {
  auto target = Runner(TargetModule());
  auto sized = ParallelSpecDrafter::Create(PsModule(true), *target);
  ASSERT_TRUE(sized.ok()) << sized.status();
  EXPECT_EQ((*sized)->capacity().blocks, target->kv_stats().num_blocks);
  EXPECT_EQ((*sized)->capacity().block_size, target->kv_stats().block_size);
  auto no_tree = ParallelSpecDrafter::Create(PsModule(true), *target,
                                             {.shape = ParallelSpecShape::kStaticTree});
  EXPECT_THAT(no_tree.status().message(), HasSubstr("static tree"));
  auto reserved = ParallelSpecDrafter::Create(PsModule(true), *target, {.name = "none"});
  EXPECT_THAT(reserved.status().message(), HasSubstr("reserved"));
  ModelConfig other = TinyModelConfig();
  other.vocab_size = 80;
  auto other_target = Runner(MakeTinyModel(other, 1));
  auto wrong = ParallelSpecDrafter::Create(PsModule(true), *other_target);
  EXPECT_THAT(wrong.status().message(), HasSubstr("vocab_size"));
}

// On a float32 CPU target a forward of up to 32 rows runs CpuForward's layer and head: the real
// rows' cache, the last row and the depth logits must be bitwise the module's, with and without
// target features and a draft vocabulary, through a catch-up over 32 rows (the module's path),
// batched and single steady observations.
TEST(ParallelSpecDrafterTest, TheCpuForwardMatchesTheModuleBitwise) {
  auto target = Runner(TargetModule());
  const auto vocab = EveryNthToken(kVocab, 3, 0);
  const int64_t d = TinyModelConfig().hidden_size;
  for (bool features : {false, true}) {
    for (bool restricted : {false, true}) {
      SCOPED_TRACE(testing::Message() << "features " << features << " restricted " << restricted);
      std::unique_ptr<ParallelSpecDrafter> drafters[2];
      for (int i = 0; i < 2; ++i) {
        auto module = PsModule(features);
        if (features) RandomBias(module->fusion->bias);
        auto created = ParallelSpecDrafter::Create(module, *target,
                                                   {.kv = {.block_size = 4, .num_blocks = 256},
                                                    .draft_vocab = restricted ? vocab : nullptr,
                                                    .cpu_forward = i == 0});
        ASSERT_TRUE(created.ok()) << created.status();
        drafters[i] = std::move(*created);
        ASSERT_TRUE(AddRoundSequences(*drafters[i]));
      }
      const auto rounds = CpuForwardRounds(features ? 1 : 0, d, kVocab);
      ObserveRoundsAndCheck(
          *drafters[0], *drafters[1], rounds, [&](SeqId seq, const std::string& where) {
            ExpectBitwiseSame(
                *drafters[0], *drafters[1], [&](auto& d) { return d.DepthLogitsOf(seq); },
                "depth logits, " + where);
            ExpectBitwiseSame(
                *drafters[0], *drafters[1], [&](auto& d) { return d.LastRow(seq); },
                "last row, " + where);
            ExpectBitwiseSame(
                *drafters[0], *drafters[1], [&](auto& d) { return d.RealCache(seq); },
                "real-row cache, " + where);
          });
    }
  }
}

}  // namespace
}  // namespace specula
