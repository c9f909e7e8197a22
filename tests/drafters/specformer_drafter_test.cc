// SpecFormerDrafter on tiny random models: the context cache equals a from-scratch recompute after
// accept/reject rounds, slot j drafts depth j + 1, budgeted trees are the k most probable paths,
// sampled chains carry their slot distributions. What every drafter must do (greedy equals plain
// decoding, bad input changes nothing, ...) is in drafter_conformance.cc.
#include "common/drafters/specformer/specformer_drafter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <random>

#include "common/drafters/specformer/specformer_model.h"
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
constexpr int64_t kSlots = 4;

// Sharp logits (no near ties), as in the other drafter tests.
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

std::shared_ptr<SpecFormerImpl> SpecModule(uint64_t seed = 5, bool causal = false,
                                           bool pending_token = false) {
  SpecFormerConfig c = SpecFormerConfig::ForTarget(TinyModelConfig(), kSlots);
  c.causal_draft = causal;
  c.pending_token = pending_token;
  auto m = std::make_shared<SpecFormerImpl>(c, TinyModelConfig());
  m->InitWeights(seed);
  {
    // Larger weights: sharper, more varied slot distributions than the 0.02 init gives.
    torch::NoGradGuard no_grad;
    for (auto& p : m->named_parameters()) {
      if (p.key().find("norm") == std::string::npos) p.value().mul_(10.0);
    }
  }
  return m;
}

std::unique_ptr<SpecFormerDrafter> Drafter(const ModelRunner& target, bool tree = true,
                                           uint64_t seed = 5, bool pending_token = false) {
  auto d = SpecFormerDrafter::Create(SpecModule(seed, /*causal=*/false, pending_token), target,
                                     {.tree = tree, .kv = {.block_size = 4, .num_blocks = 256}});
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? std::move(*d) : nullptr;
}

std::vector<int32_t> RandomTokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % kVocab);
  return t;
}

// The target's hooked hidden states of `tokens` from one dense causal forward: [n, d] per layer.
std::vector<torch::Tensor> DenseHidden(CausalLMImpl& target, const std::vector<int32_t>& tokens,
                                       const std::vector<int64_t>& layers) {
  torch::NoGradGuard no_grad;
  const int64_t n = static_cast<int64_t>(tokens.size());
  auto ids = torch::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()), torch::kLong);
  auto in = target.DenseCausalInputs(1, n, torch::arange(n, torch::kLong));
  return target.forward(ids, in, nullptr, layers).hidden_states;
}

// From scratch: the context attention's keys/values [n, nkv, hd] and the slot logits [l_d, V] at
// the last position, for the hidden states of `tokens` but the last (the pending one, whose
// embedding row n - 1 reads with pending_token).
struct Recomputed {
  torch::Tensor keys, values, slot_logits;
};
Recomputed Recompute(SpecFormerImpl& m, CausalLMImpl& target, const std::vector<int32_t>& tokens) {
  torch::NoGradGuard no_grad;
  const int64_t n = static_cast<int64_t>(tokens.size()) - 1;
  const ModelConfig& lc = m.layer_config();
  const std::vector<int32_t> cached(tokens.begin(), tokens.end() - 1);
  const auto next = torch::tensor(std::vector<int64_t>(tokens.begin() + 1, tokens.end()));
  auto x = m.Hook(DenseHidden(target, cached, m.config().hidden_layers), next);
  auto normed = m.context_norm(x);
  auto cs = m.RopeFor(torch::arange(n, torch::kLong));
  Recomputed r;
  r.keys = ApplyRope(m.context_attn->k_proj(normed).view({n, lc.num_key_value_heads, lc.head_dim}),
                     cs.first, cs.second);
  r.values = m.context_attn->v_proj(normed).view({n, lc.num_key_value_heads, lc.head_dim});
  auto c = m.Context(x, m.DenseContextInputs(1, n), nullptr);
  r.slot_logits = m.Logits(m.Slots(c.narrow(0, n - 1, 1)))[0].to(torch::kFloat);
  return r;
}

void ExpectMatchesRecompute(SpecFormerDrafter& d, CausalLMImpl& target, SeqId seq,
                            const std::string& what) {
  auto tokens = d.Tokens(seq);
  ASSERT_TRUE(tokens.ok());
  // The engine defers a sequence's observation to its next draft: nothing observed yet.
  if (tokens->empty()) return;
  auto cache = d.ContextCache(seq);
  ASSERT_TRUE(cache.ok());
  // Every position but the pending token's.
  ASSERT_EQ(cache->first.size(0), static_cast<int64_t>(tokens->size()) - 1) << what;
  Recomputed r = Recompute(*d.module(), target, *tokens);
  EXPECT_TRUE(torch::allclose(cache->first, r.keys, 1e-4, 1e-4)) << what << ": keys differ";
  EXPECT_TRUE(torch::allclose(cache->second, r.values, 1e-4, 1e-4)) << what << ": values differ";
  auto logits = d.SlotLogits(seq);
  ASSERT_TRUE(logits.ok()) << logits.status();
  EXPECT_TRUE(torch::allclose(*logits, r.slot_logits, 1e-3, 1e-3)) << what << ": slot logits";
}

// Drives the drafter as the engine does: prefill, then rounds that append "accepted drafts + bonus"
// of random lengths (hidden states for the old pending token + the accepted ones), checking the
// cache against a recompute after every round. Parameter: pending_token.
class SpecFormerCacheTest : public ::testing::TestWithParam<bool> {};

TEST_P(SpecFormerCacheTest, ContextCacheEqualsRecomputeAfterRounds) {
  auto target_module = TargetModule();
  auto target = Runner(target_module);
  auto d = Drafter(*target, /*tree=*/true, /*seed=*/5, GetParam());
  const std::vector<int32_t> tokens = RandomTokens(60, 11);
  const auto layers = d->hidden_layers();
  const auto hidden = DenseHidden(*target_module, tokens, layers);  // exact causal states
  auto rows = [&](int64_t from, int64_t n) {
    std::vector<at::Tensor> h;
    for (const auto& t : hidden) h.push_back(t.narrow(0, from, n));
    return h;
  };
  const std::vector<SeqId> seqs = {101, 102};
  for (SeqId s : seqs) ASSERT_TRUE(d->AddSequence(s, {}).ok());
  // Prefill: prompt of 9 (seq 101) / 4 (seq 102) tokens + the first generated one.
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
      const int64_t accepted = rng() % 4;  // 0 = every draft rejected
      const int64_t added = accepted + 1;  // + the bonus token
      obs.push_back(
          {.seq = seqs[b],
           .tokens = std::vector<int32_t>(tokens.begin() + len[b], tokens.begin() + len[b] + added),
           .hidden = rows(len[b] - 1, added)});
      len[b] += added;
    }
    ASSERT_TRUE(d->Observe(obs).ok());
    for (SeqId s : seqs) {
      ExpectMatchesRecompute(*d, *target_module, s, "round " + std::to_string(round));
    }
  }
}

// The same through SpecEngine: the hidden rows the engine hands over (from tree verification of
// accepted and rejected drafts) rebuild exactly the recomputed cache.
TEST_P(SpecFormerCacheTest, EngineRoundsKeepCacheEqualToRecompute) {
  auto target_module = TargetModule();
  auto target = Runner(target_module);
  SpecEngine engine(target.get());
  ASSERT_TRUE(engine.AddDrafter(Drafter(*target, /*tree=*/true, /*seed=*/5, GetParam())).ok());
  auto* d = static_cast<SpecFormerDrafter*>(engine.drafter("specformer"));
  for (int i = 0; i < 3; ++i) {
    SpecRequest r;
    r.generation.prompt = RandomTokens(5 + 7 * i, 20 + i);
    r.generation.max_new_tokens = 60;
    r.speculation = {.drafter = "specformer", .max_draft_tokens = 6};
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

INSTANTIATE_TEST_SUITE_P(PendingToken, SpecFormerCacheTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Pending" : "Paper"; });

TEST(SpecFormerDrafterTest, SlotJDraftsDepthJPlus1) {
  auto target = Runner(TargetModule());
  auto d = Drafter(*target, /*tree=*/false);
  const auto layers = d->hidden_layers();
  const std::vector<int32_t> tokens = RandomTokens(12, 4);
  ASSERT_TRUE(d->AddSequence(1, {}).ok());
  ASSERT_TRUE(d->Observe({{.seq = 1,
                           .tokens = tokens,
                           .hidden = DenseHidden(*target->module(),
                                                 {tokens.begin(), tokens.end() - 1}, layers)}})
                  .ok());
  auto logits = d->SlotLogits(1);
  ASSERT_TRUE(logits.ok());
  auto trees = d->Propose({{.seq = 1, .max_nodes = 8, .max_depth = 8}});
  ASSERT_TRUE(trees.ok());
  const CandidateTree& chain = (*trees)[0];
  ASSERT_EQ(chain.size(), kSlots);  // the chain is as long as the slots allow
  for (int32_t i = 0; i < chain.size(); ++i) {
    EXPECT_EQ(chain.parent(i), i - 1);
    auto row = (*logits)[i].contiguous();
    EXPECT_EQ(chain.token(i), row.argmax().item<int64_t>()) << "depth " << i + 1;
    EXPECT_NEAR(chain.draft_prob(i), torch::softmax(row, 0).max().item<float>(), 1e-5);
  }
  // Budget and depth limits.
  trees = d->Propose({{.seq = 1, .max_nodes = 2, .max_depth = 8}});
  EXPECT_EQ((*trees)[0].size(), 2);
  trees = d->Propose({{.seq = 1, .max_nodes = 8, .max_depth = 3}});
  EXPECT_EQ((*trees)[0].size(), 3);
  trees = d->Propose({{.seq = 1, .max_nodes = 0, .max_depth = 3}});
  EXPECT_TRUE((*trees)[0].empty());
}

// Budgeted trees are the k paths of highest probability product, found by brute force here.
TEST(SpecFormerDrafterTest, BudgetedTreeIsTheKMostProbablePaths) {
  auto target = Runner(TargetModule());
  auto d = Drafter(*target, /*tree=*/true, /*seed=*/9);
  const std::vector<int32_t> tokens = RandomTokens(20, 8);
  ASSERT_TRUE(d->AddSequence(1, {}).ok());
  ASSERT_TRUE(
      d->Observe({{.seq = 1,
                   .tokens = tokens,
                   .hidden = DenseHidden(*target->module(), {tokens.begin(), tokens.end() - 1},
                                         d->hidden_layers())}})
          .ok());
  auto logits = d->SlotLogits(1);
  ASSERT_TRUE(logits.ok());
  auto probs = torch::softmax(logits->to(torch::kDouble), -1);  // [l_d, V]
  for (int32_t depth : {1, 2, 3}) {
    for (int32_t k : {1, 2, 3, 6, 10}) {
      auto trees = d->Propose({{.seq = 1, .max_nodes = k, .max_depth = depth}});
      ASSERT_TRUE(trees.ok());
      const CandidateTree& tree = (*trees)[0];
      ASSERT_TRUE(tree.Validate(kVocab, k, depth).ok());
      ASSERT_EQ(tree.size(), k);
      std::vector<double> got;
      for (int32_t i = 0; i < tree.size(); ++i) {
        double p = 1;
        int32_t level = 0;
        for (int32_t node : tree.PathTo(i)) p *= probs[level++][tree.token(node)].item<double>();
        got.push_back(p);
      }
      // Brute force: every path of depth <= `depth` over the top-k tokens of each slot.
      std::vector<double> all;
      std::function<void(int32_t, double)> walk = [&](int32_t level, double p) {
        if (level == depth) return;
        auto top = std::get<1>(probs[level].topk(k));
        for (int64_t r = 0; r < top.size(0); ++r) {
          const double q = p * probs[level][top[r].item<int64_t>()].item<double>();
          all.push_back(q);
          walk(level + 1, q);
        }
      };
      walk(0, 1.0);
      std::sort(all.rbegin(), all.rend());
      std::sort(got.rbegin(), got.rend());
      for (int32_t i = 0; i < k; ++i) {
        EXPECT_NEAR(got[i], all[i], 1e-6 * std::max(1.0, all[i])) << "k=" << k << " i=" << i;
      }
    }
  }
}

// Sampled requests get a chain sampled from each slot's shaped distribution, with it attached, in
// both modes.
TEST(SpecFormerDrafterTest, SampledChainsCarryTheShapedSlotDistribution) {
  auto target = Runner(TargetModule());
  const SamplingParams sampling{.temperature = 0.8f, .top_k = 10, .seed = 3};
  const std::vector<int32_t> tokens = RandomTokens(15, 2);
  for (bool tree : {false, true}) {
    auto d = Drafter(*target, tree);
    ASSERT_TRUE(d->AddSequence(1, sampling).ok());
    ASSERT_TRUE(
        d->Observe({{.seq = 1,
                     .tokens = tokens,
                     .hidden = DenseHidden(*target->module(), {tokens.begin(), tokens.end() - 1},
                                           d->hidden_layers())}})
            .ok());
    auto logits = d->SlotLogits(1);
    auto trees = d->Propose({{.seq = 1, .max_nodes = 4, .max_depth = 4}});
    ASSERT_TRUE(trees.ok());
    const CandidateTree& t = (*trees)[0];
    ASSERT_TRUE(t.Validate(kVocab, 4, 4).ok());
    ASSERT_EQ(t.size(), 4);
    // A tree drafter drafts sampled requests as the sampled chain too (a deterministic candidate
    // would be accepted with just the target's probability of it).
    for (int32_t i = 0; i < t.size(); ++i) {
      EXPECT_EQ(t.parent(i), i - 1) << "tree " << tree << ": a chain";
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

// On a float32 CPU target a step of up to 32 rows runs SpecFormerCpuForward: its context cache
// and slot logits must be bitwise the module's, for every slot attention, with and without the
// pending token and a draft vocabulary, through catch-ups (the module's path), batched steady
// observations and single ones.
TEST(SpecFormerDrafterTest, TheCpuForwardMatchesTheModuleBitwise) {
  auto target = Runner(TargetModule());
  const auto vocab = EveryNthToken(kVocab, 2, 1);
  const int64_t d = TinyModelConfig().hidden_size;
  for (bool causal : {false, true}) {
    for (bool pending : {false, true}) {
      for (int variant = 0; variant < 3; ++variant) {
        // The whole and a restricted head; and the CPU forward without packed weights.
        const bool restricted = variant == 1;
        const bool packed = variant != 2;
        SCOPED_TRACE(testing::Message() << "causal " << causal << " pending " << pending
                                        << " restricted " << restricted << " packed " << packed);
        std::unique_ptr<SpecFormerDrafter> drafters[2];
        for (int i = 0; i < 2; ++i) {
          auto module = SpecModule(5, causal, pending);
          RandomBias(module->positional_ffn->bias);
          auto created = SpecFormerDrafter::Create(module, *target,
                                                   {.kv = {.block_size = 4, .num_blocks = 256},
                                                    .draft_vocab = restricted ? vocab : nullptr,
                                                    .cpu_forward = i == 0,
                                                    .packed_weights = packed});
          ASSERT_TRUE(created.ok()) << created.status();
          drafters[i] = std::move(*created);
          ASSERT_TRUE(AddRoundSequences(*drafters[i]));
        }
        const auto rounds = CpuForwardRounds(drafters[0]->hidden_layers().size(), d, kVocab);
        ObserveRoundsAndCheck(
            *drafters[0], *drafters[1], rounds, [&](SeqId seq, const std::string& where) {
              ExpectBitwiseSame(
                  *drafters[0], *drafters[1], [&](auto& d) { return d.SlotLogits(seq); },
                  "slot logits, " + where);
              ExpectBitwiseSame(
                  *drafters[0], *drafters[1], [&](auto& d) { return d.ContextCache(seq); },
                  "context cache, " + where);
            });
        // Batched proposals (two sequences' slots in one draft block) agree too.
        auto fast = drafters[0]->Propose({{.seq = 1, .max_nodes = 4, .max_depth = 4},
                                          {.seq = 2, .max_nodes = 3, .max_depth = 3}});
        auto reference = drafters[1]->Propose({{.seq = 1, .max_nodes = 4, .max_depth = 4},
                                               {.seq = 2, .max_nodes = 3, .max_depth = 3}});
        ASSERT_TRUE(fast.ok() && reference.ok());
        for (size_t i = 0; i < 2; ++i) {
          EXPECT_EQ((*fast)[i].tokens(), (*reference)[i].tokens());
          EXPECT_EQ((*fast)[i].parents(), (*reference)[i].parents());
          for (int32_t n = 0; n < (*fast)[i].size(); ++n) {
            EXPECT_EQ((*fast)[i].draft_prob(n), (*reference)[i].draft_prob(n));
          }
        }
      }
    }
  }
}

TEST(SpecFormerDrafterTest, CreateRejectsAnotherTarget) {
  ModelConfig other = TinyModelConfig();
  other.vocab_size = 80;
  auto target = Runner(MakeTinyModel(other, 1));
  auto d = SpecFormerDrafter::Create(SpecModule(), *target);
  ASSERT_FALSE(d.ok());
  EXPECT_THAT(d.status().message(), HasSubstr("vocab_size"));
}

TEST(SpecFormerDrafterTest, ContextCacheIsSizedFromTheTargetsKvCache) {
  auto target = Runner(TargetModule());
  auto d = SpecFormerDrafter::Create(SpecModule(), *target);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ((*d)->capacity().blocks, target->kv_stats().num_blocks);
  EXPECT_EQ((*d)->capacity().block_size, target->kv_stats().block_size);
}

// Issue 19: with a cache too small for every sequence, one overflow in the batched Observe turned
// speculation off for all of them. The engine reserves each sequence's worst case in the cache at
// admission: the sequences that fit draft, the others decode without a draft, all output is
// unchanged.
TEST(SpecFormerDrafterTest, ACacheTooSmallForAllCostsOnlyTheSequencesThatDoNotFit) {
  auto target_module = TargetModule();
  auto target = Runner(target_module);
  std::vector<SpecRequest> requests;
  std::vector<std::vector<int32_t>> plain;
  for (int i = 0; i < 5; ++i) {
    GenerationRequest g{.prompt = RandomTokens(3 + 9 * i, 60 + i), .max_new_tokens = 30};
    auto out = DecodeBatch(*target, {g});
    ASSERT_TRUE(out.ok());
    plain.push_back((*out)[0].tokens);
    requests.push_back(
        {.generation = g, .speculation = {.drafter = "specformer", .max_draft_tokens = 4}});
  }
  // 20 blocks of 4: the first two sequences need 8 and 11 (prompt + max_new_tokens - 1
  // positions), the third would need 13 more.
  auto drafter =
      SpecFormerDrafter::Create(SpecModule(), *target, {.kv = {.block_size = 4, .num_blocks = 20}});
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  SpecEngine engine(target.get());
  ASSERT_TRUE(engine.AddDrafter(std::move(*drafter)).ok());
  auto out = GenerateAll(engine, requests);
  ASSERT_TRUE(out.ok()) << out.status();
  for (size_t i = 0; i < requests.size(); ++i) {
    const SpecRequestStats& st = (*out)[i].stats;
    EXPECT_EQ((*out)[i].result.tokens, plain[i]) << i;
    if (i < 2) {
      EXPECT_EQ(st.draft_errors, 0) << i << ": " << st.last_draft_error;
      EXPECT_GT(st.draft_tokens, 0) << i;
    } else {
      EXPECT_EQ(st.draft_errors, 1) << i;
      EXPECT_THAT(st.last_draft_error, HasSubstr("RESOURCE_EXHAUSTED: drafter 'specformer'"));
    }
  }
}

}  // namespace
}  // namespace specula
