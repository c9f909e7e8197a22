// BeagleDrafter on tiny random models: the true-state cache equals a from-scratch recompute after
// accept/reject rounds (directly and through SpecEngine), every tree node's probability equals an
// independent per-path recompute (with and without "concate"), the dynamic tree respects each
// step's budget, and checkpoints round-trip and refuse another target. What every drafter must do
// (greedy equals plain decoding, bad input changes nothing, ...) is in drafter_conformance.cc.
#include "common/drafters/beagle/beagle_drafter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "common/drafters/beagle/beagle_model.h"
#include "common/engine/plain_decoder.h"
#include "common/model/cpu_kernels.h"
#include "common/model/transformer.h"
#include "common/spec/spec_engine.h"
#include "tests/drafters/cpu_forward_checks.h"
#include "tests/testing/tiny_model.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kVocab = 64;

std::shared_ptr<CausalLMImpl> TargetModule(uint64_t seed = 3) {
  return MakeTinyModel(TinyModelConfig(), seed, /*weight_scale=*/4.0);
}

std::unique_ptr<ModelRunner> Runner(std::shared_ptr<CausalLMImpl> module) {
  ModelRunnerOptions o;
  o.kv.block_size = 4;
  o.kv.num_blocks = 1024;
  auto runner = ModelRunner::FromModule(std::move(module), o);
  EXPECT_TRUE(runner.ok()) << runner.status();
  return runner.ok() ? std::move(*runner) : nullptr;
}

std::shared_ptr<BeagleImpl> BeagleModule(uint64_t seed = 5) {
  auto m =
      std::make_shared<BeagleImpl>(BeagleConfig::ForTarget(TinyModelConfig()), TinyModelConfig());
  m->InitWeights(seed);
  torch::NoGradGuard no_grad;
  // Larger weights: sharper, more varied distributions than the 0.02 init gives.
  for (auto& p : m->named_parameters()) {
    if (p.key().find("norm") == std::string::npos) p.value().mul_(10.0);
  }
  return m;
}

std::unique_ptr<BeagleDrafter> Drafter(const ModelRunner& target, BeagleDrafterOptions o = {}) {
  o.kv = {.block_size = 4, .num_blocks = 256};
  auto d = BeagleDrafter::Create(BeagleModule(), target, o);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

std::vector<int32_t> RandomTokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % kVocab);
  return t;
}

// The target's top hidden states (layer L, after the final norm) of `tokens`, [n, d].
torch::Tensor TopHidden(CausalLMImpl& target, const std::vector<int32_t>& tokens) {
  torch::NoGradGuard no_grad;
  const int64_t n = static_cast<int64_t>(tokens.size());
  auto ids = torch::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()), torch::kLong);
  auto in = target.DenseCausalInputs(1, n, torch::arange(n, torch::kLong));
  return target.forward(ids, in, nullptr, {target.config().num_hidden_layers}).hidden_states[0];
}

void ExpectCacheMatchesRecompute(BeagleDrafter& d, CausalLMImpl& target, SeqId seq,
                                 const std::string& what) {
  torch::NoGradGuard no_grad;
  auto tokens = d.Tokens(seq);
  ASSERT_TRUE(tokens.ok());
  // The engine defers a sequence's observation to its next draft: nothing observed yet.
  if (tokens->empty()) return;
  std::vector<int32_t> cached(tokens->begin(), tokens->end() - 1);  // all but the pending token
  auto cache = d.TrueCache(seq);
  ASSERT_TRUE(cache.ok());
  const int64_t n = static_cast<int64_t>(cached.size());
  ASSERT_EQ(cache->first.size(0), n) << what;
  auto [k, v] = d.module()->KeysValues(TopHidden(target, cached), torch::arange(n, torch::kLong));
  EXPECT_TRUE(torch::allclose(cache->first, k, 1e-4, 1e-4)) << what << ": keys differ";
  EXPECT_TRUE(torch::allclose(cache->second, v, 1e-4, 1e-4)) << what << ": values differ";
}

// Drives the drafter as the engine does: prefill, then rounds that append "accepted drafts +
// bonus" of random lengths, with a Propose in between (whose drafted states must not stay).
TEST(BeagleDrafterTest, TrueCacheEqualsRecomputeAfterRounds) {
  auto target_module = TargetModule();
  auto target = Runner(target_module);
  auto d = Drafter(*target);
  const std::vector<int32_t> tokens = RandomTokens(60, 11);
  const torch::Tensor hidden = TopHidden(*target_module, tokens);
  const std::vector<SeqId> seqs = {101, 102};
  for (SeqId s : seqs) ASSERT_TRUE(d->AddSequence(s, {}).ok());
  std::vector<int64_t> len = {10, 5};
  {
    std::vector<DrafterObservation> obs;
    for (size_t b = 0; b < seqs.size(); ++b) {
      obs.push_back({.seq = seqs[b],
                     .tokens = std::vector<int32_t>(tokens.begin(), tokens.begin() + len[b]),
                     .hidden = {hidden.narrow(0, 0, len[b] - 1)}});
    }
    ASSERT_TRUE(d->Observe(obs).ok());
  }
  for (SeqId s : seqs) ExpectCacheMatchesRecompute(*d, *target_module, s, "after prefill");
  std::mt19937 rng(3);
  for (int round = 0; round < 8; ++round) {
    auto trees = d->Propose({{.seq = 101, .max_nodes = 20, .max_depth = 5},
                             {.seq = 102, .max_nodes = 7, .max_depth = 3}});
    ASSERT_TRUE(trees.ok()) << trees.status();
    EXPECT_FALSE((*trees)[0].empty());
    std::vector<DrafterObservation> obs;
    for (size_t b = 0; b < seqs.size(); ++b) {
      const int64_t added = rng() % 4 + 1;  // accepted drafts (0-3) + the bonus token
      obs.push_back(
          {.seq = seqs[b],
           .tokens = std::vector<int32_t>(tokens.begin() + len[b], tokens.begin() + len[b] + added),
           .hidden = {hidden.narrow(0, len[b] - 1, added)}});
      len[b] += added;
    }
    ASSERT_TRUE(d->Observe(obs).ok());
    for (SeqId s : seqs) {
      ExpectCacheMatchesRecompute(*d, *target_module, s, "round " + std::to_string(round));
    }
  }
}

// Through SpecEngine: the hidden rows it hands over after verifying trees with accepted and
// rejected nodes rebuild exactly the recomputed cache.
TEST(BeagleDrafterTest, EngineRoundsKeepCacheEqualToRecompute) {
  auto target_module = TargetModule();
  auto target = Runner(target_module);
  SpecEngine engine(target.get());
  ASSERT_TRUE(engine.AddDrafter(Drafter(*target)).ok());
  auto* d = static_cast<BeagleDrafter*>(engine.drafter("beagle"));
  for (int i = 0; i < 3; ++i) {
    SpecRequest r;
    r.generation.prompt = RandomTokens(5 + 7 * i, 20 + i);
    r.generation.max_new_tokens = 60;
    r.speculation = {.drafter = "beagle", .max_draft_tokens = 12};
    ASSERT_TRUE(engine.Submit(r).ok());
  }
  int64_t drafted = 0, accepted = 0;
  for (int step = 0; step < 10; ++step) {
    auto report = engine.Step();
    ASSERT_TRUE(report.ok()) << report.status();
    for (const auto& u : report->updates) {
      ASSERT_FALSE(u.finished) << "a request finished early";
      EXPECT_EQ(u.stats.draft_errors, 0) << u.stats.last_draft_error;
      drafted = std::max(drafted, u.stats.draft_tokens);
      accepted = std::max(accepted, u.stats.accepted_tokens);
    }
    for (SeqId s : d->sequences()) {
      ExpectCacheMatchesRecompute(*d, *target_module, s, "step " + std::to_string(step));
    }
  }
  EXPECT_GT(drafted, accepted) << "no draft was ever rejected";
  EXPECT_GT(d->StateBytes(), 0);
}

// An independent recompute of one node's child distribution: queries and keys for the node's
// path built one position at a time, attention by the target's MaskedAttention.
torch::Tensor ReferenceLogProbs(BeagleImpl& m, const torch::Tensor& true_states, int32_t pending,
                                const std::vector<int32_t>& path, bool concat,
                                float rank_temperature) {
  torch::NoGradGuard no_grad;
  const int64_t P = true_states.size(0);
  const BeagleConfig& c = m.config();
  auto [true_k, true_v] = m.KeysValues(true_states, torch::arange(P, torch::kLong));
  std::vector<torch::Tensor> ks = {true_k}, vs = {true_v};
  std::vector<int32_t> queries = {pending};
  queries.insert(queries.end(), path.begin(), path.end());
  torch::Tensor h;
  for (size_t i = 0; i < queries.size(); ++i) {
    auto pos = torch::tensor({P + static_cast<int64_t>(i)}, torch::kLong);
    auto q = m.Query(torch::tensor({static_cast<int64_t>(queries[i])}, torch::kLong), pos);
    auto k = torch::cat(ks, 0), v = torch::cat(vs, 0);
    const int64_t T = k.size(0);
    auto o = MaskedAttention(q.q.view({1, 1, c.num_attention_heads, c.head_dim}), k.unsqueeze(0),
                             v.unsqueeze(0), torch::ones({1, 1, 1, 1, T}, torch::kBool));
    h = m.Output(q.residual, o.reshape({1, -1}));
    if (concat) {
      auto [hk, hv] = m.KeysValues(h, pos);
      ks.push_back(hk);
      vs.push_back(hv);
    }
  }
  return torch::log_softmax(m.Logits(h)[0].to(torch::kFloat) / rank_temperature, -1);
}

TEST(BeagleDrafterTest, TreeProbabilitiesEqualAPerPathRecompute) {
  auto target_module = TargetModule();
  auto target = Runner(target_module);
  const std::vector<int32_t> tokens = RandomTokens(17, 8);
  const torch::Tensor hidden = TopHidden(*target_module, {tokens.begin(), tokens.end() - 1});
  for (auto [concat, temperature] : {std::pair{true, 1.0f}, {false, 1.0f}, {true, 0.5f}}) {
    // Budget 60 >= the 4 + 3 x 16 candidates: every candidate is kept, down to depth 4.
    auto d = Drafter(*target, {.depth = 4,
                               .top_k = 4,
                               .total_tokens = 60,
                               .concat = concat,
                               .rank_temperature = temperature});
    ASSERT_TRUE(d->AddSequence(1, {}).ok());
    ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = tokens, .hidden = {hidden}}}).ok());
    auto trees = d->Propose({{.seq = 1, .max_nodes = 60, .max_depth = 4}});
    ASSERT_TRUE(trees.ok()) << trees.status();
    const CandidateTree& tree = (*trees)[0];
    ASSERT_EQ(tree.size(), 52);
    EXPECT_EQ(tree.max_depth(), 4);
    for (int32_t i = 0; i < tree.size(); ++i) {
      std::vector<int32_t> parent_path;
      for (int32_t n : tree.PathTo(i)) parent_path.push_back(tree.token(n));
      parent_path.pop_back();
      auto ref =
          ReferenceLogProbs(*d->module(), hidden, tokens.back(), parent_path, concat, temperature);
      EXPECT_NEAR(std::log(tree.draft_prob(i)), ref[tree.token(i)].item<float>(), 1e-3)
          << "concat " << concat << " T " << temperature << " node " << i << " depth "
          << tree.depth(i);
      if (tree.parent(i) < 0) {
        // The root's children are its top tokens.
        EXPECT_GE(ref[tree.token(i)].item<float>(),
                  std::get<0>(ref.topk(4))[3].item<float>() - 1e-5);
      }
    }
  }
}

// A sampled request drafts a chain: each node drawn from, and carrying, the drafter's distribution
// at the request's temperature for the node's path (the per-path recompute), in both modes.
TEST(BeagleDrafterTest, SampledRequestsDraftSampledChainsOfThePathDistribution) {
  auto target_module = TargetModule();
  auto target = Runner(target_module);
  const std::vector<int32_t> tokens = RandomTokens(19, 8);
  const torch::Tensor hidden = TopHidden(*target_module, {tokens.begin(), tokens.end() - 1});
  const float temperature = 0.8f;
  for (bool tree_mode : {true, false}) {
    auto d = Drafter(*target, {.tree = tree_mode, .depth = 4});
    ASSERT_TRUE(d->AddSequence(1, {.temperature = temperature, .seed = 5}).ok());
    ASSERT_TRUE(d->AddSequence(2, {}).ok());  // a greedy neighbour in the same call
    ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = tokens, .hidden = {hidden}},
                            {.seq = 2, .tokens = tokens, .hidden = {hidden}}})
                    .ok());
    auto trees = d->Propose(
        {{.seq = 1, .max_nodes = 16, .max_depth = 4}, {.seq = 2, .max_nodes = 16, .max_depth = 4}});
    ASSERT_TRUE(trees.ok()) << trees.status();
    const CandidateTree& chain = (*trees)[0];
    ASSERT_EQ(chain.size(), 4);
    EXPECT_EQ((*trees)[1].size(), tree_mode ? 16 : 4);
    std::vector<int32_t> path;
    for (int32_t i = 0; i < chain.size(); ++i) {
      EXPECT_EQ(chain.parent(i), i - 1);
      ASSERT_GE(chain.proposal(i), 0) << "node " << i << " carries no distribution";
      auto ref = torch::softmax(
          ReferenceLogProbs(*d->module(), hidden, tokens.back(), path, /*concat=*/true, 1.0f) /
              temperature,
          -1);
      const int32_t j = chain.proposal(i);
      ASSERT_TRUE(chain.distribution_is_dense(j));
      ASSERT_EQ(chain.distribution(j).size(), static_cast<size_t>(kVocab));
      for (int32_t v = 0; v < kVocab; ++v) {
        EXPECT_NEAR(chain.distribution(j)[v], ref[v].item<float>(), 1e-4)
            << "tree " << tree_mode << " node " << i << " token " << v;
      }
      EXPECT_GT(ref[chain.token(i)].item<float>(), 0);
      path.push_back(chain.token(i));
    }
  }
}

TEST(BeagleDrafterTest, TreesRespectEveryBudget) {
  auto target = Runner(TargetModule());
  auto d = Drafter(*target);
  const std::vector<int32_t> tokens = RandomTokens(12, 4);
  ASSERT_TRUE(d->AddSequence(1, {}).ok());
  ASSERT_TRUE(d->AddSequence(2, {.temperature = 0.7f, .seed = 3}).ok());
  const torch::Tensor hidden = TopHidden(*target->module(), {tokens.begin(), tokens.end() - 1});
  ASSERT_TRUE(d->Observe({{.seq = 1, .tokens = tokens, .hidden = {hidden}},
                          {.seq = 2, .tokens = tokens, .hidden = {hidden}}})
                  .ok());
  for (int32_t budget : {0, 1, 2, 3, 7, 16, 60, 100}) {
    for (int32_t depth : {0, 1, 2, 6, 9}) {
      auto trees = d->Propose({{.seq = 1, .max_nodes = budget, .max_depth = depth},
                               {.seq = 2, .max_nodes = budget, .max_depth = depth}});
      ASSERT_TRUE(trees.ok()) << trees.status();
      for (size_t i = 0; i < trees->size(); ++i) {
        const CandidateTree& t = (*trees)[i];
        EXPECT_TRUE(t.Validate(kVocab, budget, depth).ok()) << t.Validate(kVocab, budget, depth);
        EXPECT_LE(t.size(), std::min(budget, 60));
        EXPECT_LE(t.max_depth(), std::min(depth, BeagleDrafterOptions{}.depth));
        if (budget <= 0 || depth <= 0) continue;
        if (i == 0) {
          // Depth 1 has only the root's 10 candidates; from depth 2 on there are >= 110.
          EXPECT_EQ(t.size(), std::min(budget, depth == 1 ? 10 : 60)) << budget << " " << depth;
        } else {
          // The sampled request: a sampled chain, one node per depth.
          EXPECT_EQ(t.size(), std::min({budget, depth, BeagleDrafterOptions{}.depth}))
              << budget << " " << depth;
          EXPECT_EQ(t.max_depth(), t.size());
          EXPECT_EQ(t.num_distributions(), t.size());
        }
      }
    }
  }
  // The chain: one node per depth.
  auto chain = Drafter(*target, {.tree = false});
  ASSERT_TRUE(chain->AddSequence(1, {}).ok());
  ASSERT_TRUE(chain->Observe({{.seq = 1, .tokens = tokens, .hidden = {hidden}}}).ok());
  auto trees = chain->Propose({{.seq = 1, .max_nodes = 10, .max_depth = 10}});
  ASSERT_TRUE(trees.ok());
  const int32_t depth = BeagleDrafterOptions{}.depth;  // the chain stops there
  ASSERT_EQ((*trees)[0].size(), depth);
  for (int32_t i = 0; i < depth; ++i) EXPECT_EQ((*trees)[0].parent(i), i - 1);
}

TEST(BeagleDrafterTest, TrueStateCacheIsSizedFromTheTargetsKvCache) {
  // Issue 19: a fixed 64 MB outside admission control. Now the target's blocks (every sequence
  // the target admits fits), or the size the options name.
  auto target = Runner(TargetModule());
  auto d = BeagleDrafter::Create(BeagleModule(), *target);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->capacity().blocks, target->kv_stats().num_blocks);
  EXPECT_EQ((*d)->capacity().block_size, target->kv_stats().block_size);
  EXPECT_EQ(Drafter(*target)->capacity().blocks, 256);
}

TEST(BeagleDrafterTest, OptionsAndTargetsAreChecked) {
  auto target = Runner(TargetModule());
  EXPECT_THAT(BeagleDrafter::Create(BeagleModule(), *target, {.depth = 0}).status().message(),
              HasSubstr("depth"));
  EXPECT_THAT(BeagleDrafter::Create(BeagleModule(), *target, {.top_k = 0}).status().message(),
              HasSubstr("top-k"));
  EXPECT_THAT(BeagleDrafter::Create(BeagleModule(), *target, {.name = "none"}).status().message(),
              HasSubstr("reserved"));
  EXPECT_THAT(
      BeagleDrafter::Create(BeagleModule(), *target, {.rank_temperature = 0}).status().message(),
      HasSubstr("rank temperature"));
  ModelConfig other = TinyModelConfig();
  other.vocab_size = 80;
  auto other_target = Runner(MakeTinyModel(other, 1));
  auto d = BeagleDrafter::Create(BeagleModule(), *other_target);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("vocab_size"));
}

TEST(BeagleDrafterTest, CheckpointRoundTripsAndRefusesAnotherKind) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("beagle_ckpt_" + std::to_string(::getpid()));
  auto module = BeagleModule(9);
  ASSERT_TRUE(SaveBeagleDir(*module, dir.string()).ok());
  auto loaded = LoadBeagleDir(dir.string(), TinyModelConfig());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto a = module->named_parameters(), b = (*loaded)->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& p : a) EXPECT_TRUE(torch::equal(p.value(), b[p.key()])) << p.key();
  ModelConfig other = TinyModelConfig();
  other.hidden_size = 48;
  EXPECT_THAT(LoadBeagleDir(dir.string(), other).status().message(), HasSubstr("hidden_size"));
  EXPECT_EQ(LoadBeagleDir((dir / "missing").string(), TinyModelConfig()).status().code(),
            StatusCode::kNotFound);
  // A SpecFormer checkpoint is not a Beagle one.
  std::string config = BeagleConfig::ForTarget(TinyModelConfig()).ToJson();
  config.replace(config.find("\"beagle\""), 8, "\"specformer\"");
  std::ofstream((dir / "config.json").string()) << config;
  EXPECT_THAT(LoadBeagleDir(dir.string(), TinyModelConfig()).status().message(),
              HasSubstr("expected \"beagle\""));
  fs::remove_all(dir);
}

// The same tree, node for node, with probabilities within float rounding.
void ExpectSameTree(const CandidateTree& a, const CandidateTree& b, double tolerance,
                    const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (int32_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a.token(i), b.token(i)) << what << " node " << i;
    EXPECT_EQ(a.parent(i), b.parent(i)) << what << " node " << i;
    EXPECT_NEAR(a.draft_prob(i), b.draft_prob(i), tolerance) << what << " node " << i;
  }
}

// On a float32 CPU target Observe and Propose run BeagleCpuForward (no LibTorch ops, RoPE and
// log-softmax in the kernels' own float order): the true-state cache and every tree must be the
// module's (trees node for node), with and without "concate" and a draft vocabulary, through a
// catch-up of 50 rows, batched and single observations, and frontiers of one and many rows.
TEST(BeagleDrafterTest, TheCpuForwardMatchesTheModule) {
  auto target = Runner(TargetModule());
  const auto vocab = EveryNthToken(kVocab, 3, 0);
  const int64_t d = TinyModelConfig().hidden_size;
  for (bool concat : {true, false}) {
    for (bool restricted : {false, true}) {
      SCOPED_TRACE(testing::Message() << "concat " << concat << " restricted " << restricted);
      std::unique_ptr<BeagleDrafter> drafters[2];
      for (int i = 0; i < 2; ++i) {
        auto created = BeagleDrafter::Create(BeagleModule(), *target,
                                             {.depth = 5,
                                              .top_k = 4,
                                              .concat = concat,
                                              .kv = {.block_size = 4, .num_blocks = 256},
                                              .draft_vocab = restricted ? vocab : nullptr,
                                              .cpu_forward = i == 0});
        ASSERT_TRUE(created.ok()) << created.status();
        drafters[i] = std::move(*created);
        ASSERT_TRUE(AddRoundSequences(*drafters[i]));
      }
      ObserveRoundsAndCheck(
          *drafters[0], *drafters[1], CpuForwardRounds(1, d, kVocab),
          [&](SeqId seq, const std::string& where) {
            auto fast = drafters[0]->TrueCache(seq), reference = drafters[1]->TrueCache(seq);
            ASSERT_TRUE(fast.ok() && reference.ok()) << where;
            EXPECT_TRUE(torch::allclose(fast->first, reference->first, 1e-5, 1e-5)) << where;
            EXPECT_TRUE(torch::allclose(fast->second, reference->second, 1e-5, 1e-5)) << where;
          });
      // Both sequences in one call (a tree of 24 nodes and a chain-like one of 3), then each.
      const std::vector<std::vector<DraftRequest>> calls = {
          {{.seq = 1, .max_nodes = 24, .max_depth = 5}, {.seq = 2, .max_nodes = 3, .max_depth = 3}},
          {{.seq = 2, .max_nodes = 40, .max_depth = 5}},
          {{.seq = 1, .max_nodes = 1, .max_depth = 1}}};
      for (size_t c = 0; c < calls.size(); ++c) {
        auto fast = drafters[0]->Propose(calls[c]), reference = drafters[1]->Propose(calls[c]);
        ASSERT_TRUE(fast.ok() && reference.ok()) << "call " << c;
        for (size_t r = 0; r < calls[c].size(); ++r) {
          EXPECT_FALSE((*fast)[r].empty());
          ExpectSameTree((*fast)[r], (*reference)[r], 1e-5,
                         "call " + std::to_string(c) + " request " + std::to_string(r));
        }
      }
    }
  }
}

// --drafter-matmul int8 / bfloat16 reach Beagle's forward where the CPU has them: its cache and
// trees stay within the copies' rounding of float32's (a sampled request's chain too).
TEST(BeagleDrafterTest, ReducedPrecisionWeightsStayCloseToFloat32) {
  auto target = Runner(TargetModule());
  const int64_t d = TinyModelConfig().hidden_size;
  for (DraftMatmul matmul : {DraftMatmul::kInt8, DraftMatmul::kBfloat16}) {
    const bool runs = matmul == DraftMatmul::kInt8 ? Int8MatmulRuns() : Bf16MatmulRuns();
    SCOPED_TRACE(testing::Message() << DraftMatmulName(matmul) << (runs ? "" : " (not here)"));
    std::unique_ptr<BeagleDrafter> drafters[2];
    for (int i = 0; i < 2; ++i) {
      auto created = BeagleDrafter::Create(BeagleModule(), *target,
                                           {.kv = {.block_size = 4, .num_blocks = 256},
                                            .matmul = i == 0 ? matmul : DraftMatmul::kFloat32});
      ASSERT_TRUE(created.ok()) << created.status();
      drafters[i] = std::move(*created);
      ASSERT_TRUE(AddRoundSequences(*drafters[i]));
    }
    EXPECT_EQ(drafters[0]->draft_matmul(), runs ? matmul : DraftMatmul::kFloat32);
    ObserveRoundsAndCheck(*drafters[0], *drafters[1], CpuForwardRounds(1, d, kVocab),
                          [&](SeqId seq, const std::string& where) {
                            auto a = drafters[0]->TrueCache(seq), b = drafters[1]->TrueCache(seq);
                            ASSERT_TRUE(a.ok() && b.ok()) << where;
                            EXPECT_TRUE(torch::allclose(a->first, b->first, 0.05, 0.05)) << where;
                            EXPECT_TRUE(torch::allclose(a->second, b->second, 0.05, 0.05)) << where;
                          });
    auto trees = drafters[0]->Propose({{.seq = 1, .max_nodes = 16, .max_depth = 5}});
    ASSERT_TRUE(trees.ok()) << trees.status();
    EXPECT_TRUE((*trees)[0].Validate(kVocab, 16, 5).ok());
    EXPECT_EQ((*trees)[0].size(), 16);
  }
}

}  // namespace
}  // namespace specula
