// The drafter conformance suite (see drafter_conformance.h). Every test loops over all cases, so
// one process start serves every drafter; failures name the case.
#include "tests/drafters/drafter_conformance.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <stdexcept>

#include "common/drafters/beagle/beagle_model.h"
#include "common/drafters/draft_vocab.h"
#include "common/drafters/drafter_registry.h"
#include "common/drafters/parallelspec/parallelspec_model.h"
#include "common/drafters/specdec/specdec_model.h"
#include "common/drafters/specformer/specformer_model.h"
#include "common/engine/plain_decoder.h"
#include "common/model/transformer.h"
#include "common/spec/spec_engine.h"
#include "tests/drafters/random_specdec.h"
#include "tests/spec/chi_square.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_model.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

// A small vocabulary: random drafters then agree with the target often enough for drafts to be
// accepted, and the sampled test's joint distribution of 3 tokens has 512 cells.
constexpr int32_t kVocab = 8;
constexpr int64_t kSampledTokens = 3;
constexpr int kSamples = 3000;

ModelConfig TargetConfig() {
  ModelConfig c = TinyModelConfig();
  c.vocab_size = kVocab;
  return c;
}

// Every weight but the norms times `scale`: sharp, varied distributions (the 0.02 init gives
// near-uniform ones, and near-ties).
void Sharpen(torch::nn::Module& m, double scale) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.named_parameters()) {
    if (p.key().find("norm") == std::string::npos) p.value().mul_(scale);
  }
}

// The target and a random checkpoint of every drafter family, written once per process.
class World {
 public:
  static World& Get() {
    static World world;  // built on first use; its directory is removed when the process exits
    return world;
  }

  const std::string& target_dir() const { return target_dir_; }
  // A checkpoint directory: target, draft, specformer, beagle, parallelspec (target features),
  // parallelspec-tokens (token embeddings only), specdec.
  std::string dir(const std::string& name) const { return tmp_.File(name); }
  // A draft vocabulary of 5 of the 8 tokens (--draft-vocab).
  std::string draft_vocab_file() const { return tmp_.File("draft_vocab.json"); }
  static std::vector<int32_t> DraftVocabTokens() { return {5, 0, 2, 7, 3}; }

  std::unique_ptr<ModelRunner> Target() const {
    ModelRunnerOptions o;
    o.kv = {.block_size = 4, .num_blocks = 2048};
    auto runner = ModelRunner::Load(target_dir_, o);
    EXPECT_TRUE(runner.ok()) << runner.status();
    return runner.ok() ? std::move(*runner) : nullptr;
  }

  // The case's drafter, loaded through the registry for `target`.
  std::unique_ptr<Drafter> Load(const ConformanceCase& c, const ModelRunner& target) const {
    DrafterRegistry registry = BuiltinDrafterRegistry();
    FlagSet flags("conformance");
    registry.RegisterFlags(flags);
    std::vector<std::string> args = {"--drafter-model=" + dir("draft"),
                                     "--specformer-model=" + dir("specformer"),
                                     "--beagle-model=" + dir("beagle"),
                                     "--beagle-depth=3",
                                     "--beagle-top-k=3",
                                     "--parallelspec-model=" + dir("parallelspec"),
                                     "--parallelspec-static-tree=" + tmp_.File("static_tree.json"),
                                     "--specdec-model=" + dir("specdec")};
    args.insert(args.end(), c.flags.begin(), c.flags.end());
    Status parsed = flags.Parse(args);
    EXPECT_TRUE(parsed.ok()) << parsed;
    DrafterLoadContext context(target, {.kv = {.block_size = 4, .num_blocks = 2048}});
    auto drafter = registry.Load(c.drafter, context);
    EXPECT_TRUE(drafter.ok()) << c.label << ": " << drafter.status();
    return drafter.ok() ? std::move(*drafter) : nullptr;
  }

 private:
  World() {
    const ModelConfig t = TargetConfig();
    target_dir_ = dir("target");
    Check(SaveModelDir(*MakeTinyModel(t, 3, /*weight_scale=*/4.0), t, target_dir_));
    Check(SaveModelDir(*MakeTinyModel(t, 9, /*weight_scale=*/4.0), t, dir("draft")));
    {
      auto m = std::make_shared<SpecFormerImpl>(SpecFormerConfig::ForTarget(t, 4), t);
      m->InitWeights(5);
      Sharpen(*m, 10.0);
      Check(SaveSpecFormerDir(*m, dir("specformer")));
    }
    {
      auto m = std::make_shared<BeagleImpl>(BeagleConfig::ForTarget(t), t);
      m->InitWeights(7);
      Sharpen(*m, 10.0);
      Check(SaveBeagleDir(*m, dir("beagle")));
    }
    for (bool features : {true, false}) {
      ParallelSpecConfig c = ParallelSpecConfig::ForTarget(t, 3);
      c.use_target_features = features;
      auto m = std::make_shared<ParallelSpecImpl>(c, t);
      m->InitWeights(features ? 11 : 12);
      Sharpen(*m, 10.0);
      Check(SaveParallelSpecDir(*m, dir(features ? "parallelspec" : "parallelspec-tokens")));
    }
    Check(
        SaveSpecDecDir(*RandomSpecDecModule(TinySpecDecConfig(t, 2, 1, 4), t, 31), dir("specdec")));
    std::ofstream(tmp_.File("static_tree.json")) << "[[0], [1], [0, 0], [0, 1], [0, 0, 0]]";
    DraftVocab vocab;
    vocab.vocab_size = kVocab;
    vocab.tokens = DraftVocabTokens();
    std::ofstream(draft_vocab_file()) << vocab.ToJson();
  }
  static void Check(const Status& s) {
    if (!s.ok()) throw std::runtime_error("conformance world: " + s.ToString());
  }

  TempDir tmp_;
  std::string target_dir_;
};

std::vector<ConformanceCase> Cases() {
  const std::string tokens_only = "--parallelspec-model=" + World::Get().dir("parallelspec-tokens");
  const std::string draft_vocab = "--draft-vocab=" + World::Get().draft_vocab_file();
  return {
      {"ngram", "ngram", {}},
      {"draft-model chain", "draft-model", {}},
      {"draft-model tree", "draft-model", {"--tree-width=3"}},
      {"draft-model, 8-token context",
       "draft-model",
       {"--draft-model-context=8"},
       /*path_independent=*/false},
      {"specformer tree", "specformer", {}},
      {"specformer chain", "specformer", {"--specformer-tree=false"}},
      {"beagle", "beagle", {}},
      {"beagle-chain", "beagle-chain", {}},
      {"parallelspec", "parallelspec", {}},
      {"parallelspec-chain", "parallelspec-chain", {}},
      {"parallelspec-static", "parallelspec-static", {}},
      {"parallelspec-ar", "parallelspec-ar", {}},
      {"parallelspec-ar tokens only", "parallelspec-ar", {tokens_only}},
      {"parallelspec tokens only", "parallelspec", {tokens_only}},
      {"specdec", "specdec", {}},
      // The drafters with an lm_head (the target's, or the draft LM's own), with a draft
      // vocabulary.
      {"draft-model chain, draft vocab", "draft-model", {draft_vocab}},
      {"specformer tree, draft vocab", "specformer", {draft_vocab}},
      {"beagle, draft vocab", "beagle", {draft_vocab}},
      {"parallelspec-chain, draft vocab", "parallelspec-chain", {draft_vocab}},
      // bfloat16 matmuls (float32 where the CPU has no AVX512-BF16): other drafts, still lossless.
      {"draft-model chain, bfloat16 matmuls", "draft-model", {"--drafter-matmul=bfloat16"}},
      {"specformer tree, bfloat16 matmuls",
       "specformer",
       {draft_vocab, "--drafter-matmul=bfloat16"}},
      // The cases above multiply int8 copies (the default, where the CPU has AVX-512); the
      // drafters' own float32 products:
      {"draft-model chain, float32 matmuls", "draft-model", {"--drafter-matmul=float32"}},
      {"specformer tree, float32 matmuls", "specformer", {draft_vocab, "--drafter-matmul=float32"}},
      {"parallelspec-chain, float32 matmuls",
       "parallelspec-chain",
       {draft_vocab, "--drafter-matmul=float32"}},
      {"beagle, float32 matmuls", "beagle", {draft_vocab, "--drafter-matmul=float32"}},
  };
}

// Every variant of the registry has a case (a new drafter joins the suite by registering).
TEST(DrafterConformanceTest, EveryRegisteredDrafterHasACase) {
  std::set<std::string> covered;
  for (const ConformanceCase& c : Cases()) covered.insert(c.drafter);
  for (const std::string& name : BuiltinDrafterRegistry().Names()) {
    EXPECT_TRUE(covered.count(name)) << name << " has no conformance case";
  }
}

struct Subject {
  std::unique_ptr<ModelRunner> target;
  std::unique_ptr<Drafter> drafter;
};

Subject Make(const ConformanceCase& c, DrafterProvider& provider) {
  Subject s;
  s.target = World::Get().Target();
  if (!s.target) return s;
  std::unique_ptr<Drafter> local = World::Get().Load(c, *s.target);
  if (local) s.drafter = provider.Provide(std::move(local), *s.target);
  return s;
}

std::vector<int32_t> RandomTokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % kVocab);
  return t;
}

// The target's hidden states of `layers` for `tokens` from one dense causal forward: [n, d] each.
std::vector<at::Tensor> Hidden(const ModelRunner& target, const std::vector<int32_t>& tokens,
                               const std::vector<int64_t>& layers) {
  if (layers.empty() || tokens.empty()) return {};
  torch::NoGradGuard no_grad;
  const int64_t n = static_cast<int64_t>(tokens.size());
  auto ids = torch::tensor(std::vector<int64_t>(tokens.begin(), tokens.end()), torch::kLong);
  CausalLMImpl& m = *target.module();
  auto in = m.DenseCausalInputs(1, n, torch::arange(n, torch::kLong));
  return m.forward(ids, in, nullptr, layers).hidden_states;
}

// The observation that appends tokens [from, to) of `history` to a sequence that holds
// [0, from): hidden rows for positions [from - 1, to - 1) (rows for every token but the pending
// one), sliced from `hidden` (rows of the whole history but its last token).
DrafterObservation Observation(SeqId seq, const std::vector<int32_t>& history, size_t from,
                               size_t to, const std::vector<at::Tensor>& hidden) {
  DrafterObservation o{.seq = seq, .tokens = {history.begin() + from, history.begin() + to}};
  const int64_t first = from == 0 ? 0 : static_cast<int64_t>(from) - 1;
  for (const at::Tensor& h : hidden) o.hidden.push_back(h.narrow(0, first, to - 1 - first));
  return o;
}

StatusOr<CandidateTree> ProposeOne(Drafter& d, SeqId seq, int32_t max_nodes, int32_t max_depth) {
  ASSIGN_OR_RETURN(auto trees,
                   d.Propose({{.seq = seq, .max_nodes = max_nodes, .max_depth = max_depth}}));
  if (trees.size() != 1) return InternalError(StrCat(trees.size(), " trees for one request"));
  return std::move(trees[0]);
}

void ExpectSameTree(const CandidateTree& a, const CandidateTree& b, const std::string& what) {
  ASSERT_EQ(a.failure().ok(), b.failure().ok()) << what;
  ASSERT_EQ(a.tokens(), b.tokens()) << what;
  ASSERT_EQ(a.parents(), b.parents()) << what;
  for (int32_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a.draft_prob(i), b.draft_prob(i), 1e-3) << what << " node " << i;
  }
}

// `d`'s next draft for sequence 1 is that of a fresh drafter of case `c` that observed only
// `good`: the calls `d` refused before changed nothing.
void ExpectLikeFreshAfter(const ConformanceCase& c, DrafterProvider& provider, Drafter& d,
                          const DrafterObservation& good, const std::string& what) {
  Subject fresh = Make(c, provider);
  ASSERT_TRUE(fresh.drafter);
  ASSERT_TRUE(fresh.drafter->AddSequence(1, {}).ok());
  ASSERT_TRUE(fresh.drafter->Observe({good}).ok());
  auto after = ProposeOne(d, 1, 6, 4);
  auto clean = ProposeOne(*fresh.drafter, 1, 6, 4);
  ASSERT_TRUE(after.ok() && clean.ok());
  ExpectSameTree(*after, *clean, what);
}

class DrafterConformance : public ::testing::Test {
 protected:
  void SetUp() override { provider_ = MakeConformanceProvider(); }
  std::unique_ptr<DrafterProvider> provider_;
};

// Greedy speculative decoding is token for token plain greedy decoding: one request, then a
// ragged batch (prompts of 3 to 30 tokens), at budgets 1, 3 and 8.
TEST_F(DrafterConformance, GreedyEqualsPlainDecoding) {
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 4; ++i) {
    requests.push_back({.prompt = RandomTokens(3 + 9 * i, 40 + i), .max_new_tokens = 20});
  }
  std::vector<std::vector<int32_t>> plain;
  {
    auto target = World::Get().Target();
    for (const auto& r : requests) {
      auto out = DecodeBatch(*target, {r});
      ASSERT_TRUE(out.ok()) << out.status();
      plain.push_back((*out)[0].tokens);
    }
  }
  for (const ConformanceCase& c : Cases()) {
    SCOPED_TRACE(c.label);
    Subject s = Make(c, *provider_);
    ASSERT_TRUE(s.drafter);
    const std::string name = s.drafter->name();
    SpecEngine engine(s.target.get());
    ASSERT_TRUE(engine.AddDrafter(std::move(s.drafter)).ok());
    int64_t accepted = 0;
    for (int32_t k : {1, 3, 8}) {
      auto spec = [&](const GenerationRequest& g) {
        return SpecRequest{.generation = g,
                           .speculation = {.drafter = name, .max_draft_tokens = k}};
      };
      auto one = GenerateAll(engine, {spec(requests[1])});
      ASSERT_TRUE(one.ok()) << one.status();
      EXPECT_EQ((*one)[0].result.tokens, plain[1]) << "k " << k;
      std::vector<SpecRequest> batch;
      for (const auto& r : requests) batch.push_back(spec(r));
      auto out = GenerateAll(engine, batch);
      ASSERT_TRUE(out.ok()) << out.status();
      for (size_t i = 0; i < requests.size(); ++i) {
        EXPECT_EQ((*out)[i].result.tokens, plain[i]) << "k " << k << " request " << i;
        EXPECT_EQ((*out)[i].stats.draft_errors, 0) << (*out)[i].stats.last_draft_error;
        accepted += (*out)[i].stats.accepted_tokens;
      }
    }
    EXPECT_GT(accepted, 0) << "no draft was ever accepted: the comparison proves little";
    EXPECT_EQ(s.target->kv_stats().free_blocks, s.target->kv_stats().num_blocks);
  }
}

// A history observed in ragged rounds (prefill, then "accepted drafts + bonus" of 1-5 tokens)
// leaves the drafter where a single observation of the whole history does: after every round the
// next drafts of the two are the same tree (for the cases whose drafts are path-independent).
TEST_F(DrafterConformance, RaggedRoundsEqualOneObservation) {
  const std::vector<int32_t> history = RandomTokens(48, 7);
  const std::vector<size_t> rounds = {1, 3, 2, 5, 1, 4, 1, 2, 5, 3};
  for (const ConformanceCase& c : Cases()) {
    if (!c.path_independent) continue;
    SCOPED_TRACE(c.label);
    Subject s = Make(c, *provider_);
    ASSERT_TRUE(s.drafter);
    Drafter& d = *s.drafter;
    const auto hidden = Hidden(*s.target, {history.begin(), history.end() - 1}, d.hidden_layers());
    ASSERT_TRUE(d.AddSequence(1, {}).ok());
    size_t seen = 13;  // prefill: the prompt (12 tokens) and the first generated token
    ASSERT_TRUE(d.Observe({Observation(1, history, 0, seen, hidden)}).ok());
    for (size_t r = 0; r <= rounds.size(); ++r) {
      // Odd rounds observe and propose in one exchange (the engine's way; one round trip for
      // a remote drafter), the others call Observe and Propose apart.
      std::optional<StatusOr<std::vector<CandidateTree>>> together;
      if (r > 0) {
        const size_t next = std::min(history.size(), seen + rounds[r - 1]);
        const DrafterObservation o = Observation(1, history, seen, next, hidden);
        Status s = OkStatus();
        if (r % 2 == 1) {
          together = d.ObserveAndPropose({o}, {{.seq = 1, .max_nodes = 6, .max_depth = 4}}, &s);
        } else {
          s = d.Observe({o});
        }
        ASSERT_TRUE(s.ok()) << "round " << r << ": " << s;
        seen = next;
      }
      Subject fresh = Make(c, *provider_);
      ASSERT_TRUE(fresh.drafter);
      ASSERT_TRUE(fresh.drafter->AddSequence(1, {}).ok());
      const std::vector<int32_t> prefix(history.begin(), history.begin() + seen);
      ASSERT_TRUE(fresh.drafter->Observe({Observation(1, prefix, 0, seen, hidden)}).ok());
      if (together) {
        ASSERT_TRUE(together->ok()) << together->status();
        ASSERT_EQ((*together)->size(), 1u);
      }
      auto incremental =
          together ? StatusOr<CandidateTree>(std::move((**together)[0])) : ProposeOne(d, 1, 6, 4);
      auto once = ProposeOne(*fresh.drafter, 1, 6, 4);
      ASSERT_TRUE(incremental.ok()) << incremental.status();
      ASSERT_TRUE(once.ok()) << once.status();
      ExpectSameTree(*incremental, *once, StrCat("after round ", r, " (", seen, " tokens)"));
    }
  }
}

// Every tree fits its request's budget (nodes and depth), a batched Propose equals one Propose per
// sequence, and drafting leaves the state alone (the same request twice gives the same tree).
TEST_F(DrafterConformance, TreesRespectEveryBudgetAndBatchingChangesNothing) {
  for (const ConformanceCase& c : Cases()) {
    SCOPED_TRACE(c.label);
    Subject s = Make(c, *provider_);
    ASSERT_TRUE(s.drafter);
    Drafter& d = *s.drafter;
    std::vector<DrafterObservation> observations;
    for (SeqId seq : {1, 2, 3}) {
      const auto tokens = RandomTokens(5 + 7 * seq, static_cast<uint32_t>(seq));
      ASSERT_TRUE(d.AddSequence(seq, {}).ok());
      observations.push_back(
          Observation(seq, tokens, 0, tokens.size(),
                      Hidden(*s.target, {tokens.begin(), tokens.end() - 1}, d.hidden_layers())));
    }
    ASSERT_TRUE(d.Observe(observations).ok());
    for (int32_t nodes : {0, 1, 2, 3, 7, 16}) {
      for (int32_t depth : {1, 2, 5}) {
        std::vector<DraftRequest> batch = {{.seq = 2, .max_nodes = nodes, .max_depth = depth},
                                           {.seq = 1, .max_nodes = 3, .max_depth = 2},
                                           {.seq = 3, .max_nodes = nodes + 1, .max_depth = 1}};
        auto trees = d.Propose(batch);
        ASSERT_TRUE(trees.ok()) << trees.status();
        ASSERT_EQ(trees->size(), batch.size());
        for (size_t i = 0; i < batch.size(); ++i) {
          const std::string what = StrCat("seq ", batch[i].seq, " nodes ", batch[i].max_nodes,
                                          " depth ", batch[i].max_depth);
          Status valid = (*trees)[i].Validate(kVocab, batch[i].max_nodes, batch[i].max_depth);
          EXPECT_TRUE(valid.ok()) << what << ": " << valid;
          if (c.label.find("draft vocab") != std::string::npos) {
            const auto allowed = World::DraftVocabTokens();
            for (int32_t t : (*trees)[i].tokens()) {
              EXPECT_NE(std::find(allowed.begin(), allowed.end(), t), allowed.end())
                  << what << ": token " << t << " is outside the draft vocabulary";
            }
          }
          auto alone = ProposeOne(d, batch[i].seq, batch[i].max_nodes, batch[i].max_depth);
          ASSERT_TRUE(alone.ok()) << alone.status();
          ExpectSameTree((*trees)[i], *alone, what + " (batched vs alone)");
        }
      }
    }
    EXPECT_GT(ProposeOne(d, 1, 4, 4)->size(), 0) << "the drafter never drafts";
  }
}

// Sampled requests (plain and shaped) get valid trees; where a node carries the proposal it was
// drawn from, the proposal is a distribution (dense, or sparse with at most the drafter service's
// top-k tokens when remote) that gives the node's token positive probability.
TEST_F(DrafterConformance, SampledTreesCarryTheirProposals) {
  const std::vector<SamplingParams> samplings = {
      {.temperature = 1.0f, .seed = 3},
      {.temperature = 0.7f, .top_k = 4, .top_p = 0.9f, .seed = 4}};
  int64_t sampled_nodes = 0;  // over every case: the chains sample
  for (const ConformanceCase& c : Cases()) {
    SCOPED_TRACE(c.label);
    Subject s = Make(c, *provider_);
    ASSERT_TRUE(s.drafter);
    Drafter& d = *s.drafter;
    const auto tokens = RandomTokens(20, 5);
    const auto hidden = Hidden(*s.target, {tokens.begin(), tokens.end() - 1}, d.hidden_layers());
    for (size_t i = 0; i < samplings.size(); ++i) {
      const SeqId seq = static_cast<SeqId>(i + 1);
      ASSERT_TRUE(d.AddSequence(seq, samplings[i]).ok());
      ASSERT_TRUE(d.Observe({Observation(seq, tokens, 0, tokens.size(), hidden)}).ok());
      for (int round = 0; round < 5; ++round) {
        auto tree = ProposeOne(d, seq, 6, 4);
        ASSERT_TRUE(tree.ok()) << tree.status();
        Status valid = tree->Validate(kVocab, 6, 4);
        ASSERT_TRUE(valid.ok()) << valid;
        for (int32_t n = 0; n < tree->size(); ++n) {
          const int32_t j = tree->proposal(n);
          if (j < 0) continue;
          auto q = tree->distribution(j);
          auto ids = tree->distribution_ids(j);
          if (provider_->proposal_top_k() == 0) {
            EXPECT_TRUE(ids.empty()) << "node " << n << ": a sparse proposal nobody asked for";
            ASSERT_EQ(q.size(), static_cast<size_t>(kVocab));
          } else {
            // Cut to the top k (below kVocab) before sampling: sparse, at most k tokens.
            EXPECT_FALSE(ids.empty()) << "node " << n << ": a dense proposal, expected top-k";
            EXPECT_LE(ids.size(), static_cast<size_t>(provider_->proposal_top_k())) << "node " << n;
            ASSERT_EQ(q.size(), ids.size());
          }
          double total = 0;
          for (float p : q) {
            EXPECT_GE(p, 0.0f);
            total += p;
          }
          EXPECT_NEAR(total, 1.0, 1e-4) << "node " << n;
          EXPECT_GT(tree->ProposalProbability(j, tree->token(n)), 0.0f)
              << "node " << n << " drew a token of probability 0";
          ++sampled_nodes;
        }
      }
    }
  }
  EXPECT_GT(sampled_nodes, 0) << "no drafter proposed a sampled node";
}

// Sampled speculative decoding keeps the target's distribution: the first 3 generated tokens of
// kSamples seeded requests, with the drafter and without, are one distribution (chi-square z < 5;
// tests/spec/spec_sampling_test shows the statistic flags a lossy rule at this sample size).
TEST_F(DrafterConformance, SampledDecodingKeepsTheTargetsDistribution) {
  const SamplingParams shaped{.temperature = 0.8f, .top_k = 6, .top_p = 0.95f};
  auto cell = [](const std::vector<int32_t>& t) {
    int64_t x = 0;
    for (int64_t i = 0; i < kSampledTokens; ++i) x = x * kVocab + t[i];
    return x;
  };
  auto requests = [&](const std::string& drafter) {
    std::vector<SpecRequest> out;
    for (int i = 0; i < kSamples; ++i) {
      SpecRequest r{.generation = {.prompt = {1, 5, 2}, .max_new_tokens = kSampledTokens},
                    .speculation = {.drafter = drafter, .max_draft_tokens = 4}};
      r.generation.sampling = shaped;
      r.generation.sampling.seed = static_cast<uint64_t>(i) + (drafter == "none" ? 1000000 : 0);
      out.push_back(r);
    }
    return out;
  };
  std::vector<int64_t> plain(kVocab * kVocab * kVocab);
  {
    auto target = World::Get().Target();
    SpecEngine engine(target.get(), {.max_batch_size = kSamples});
    auto out = GenerateAll(engine, requests("none"));
    ASSERT_TRUE(out.ok()) << out.status();
    for (const auto& r : *out) ++plain[cell(r.result.tokens)];
  }
  for (const ConformanceCase& c : Cases()) {
    SCOPED_TRACE(c.label);
    Subject s = Make(c, *provider_);
    ASSERT_TRUE(s.drafter);
    const std::string name = s.drafter->name();
    SpecEngine engine(s.target.get(), {.max_batch_size = kSamples});
    ASSERT_TRUE(engine.AddDrafter(std::move(s.drafter)).ok());
    auto out = GenerateAll(engine, requests(name));
    ASSERT_TRUE(out.ok()) << out.status();
    std::vector<int64_t> spec(plain.size());
    int64_t accepted = 0, steps = 0;
    for (const auto& r : *out) {
      ++spec[cell(r.result.tokens)];
      accepted += r.stats.accepted_tokens;
      steps += r.stats.draft_steps;
      EXPECT_EQ(r.stats.draft_errors, 0) << r.stats.last_draft_error;
    }
    const double z = ChiSquareTwoSampleZ(plain, spec);
    EXPECT_LT(z, 5.0);
    EXPECT_GT(accepted, 0) << "no draft was accepted: the comparison proves little";
    std::printf("%s%s: z = %.2f, accepted drafts per step %.2f\n",
                provider_->remote() ? "remote " : "", c.label.c_str(), z,
                steps ? static_cast<double>(accepted) / steps : 0.0);
  }
}

// Bad calls get the documented code and change nothing: the drafts afterwards are those of a
// drafter that never saw them, and a released sequence is gone.
TEST_F(DrafterConformance, BadInputIsRefusedAndChangesNothing) {
  const auto tokens = RandomTokens(16, 9);
  for (const ConformanceCase& c : Cases()) {
    SCOPED_TRACE(c.label);
    Subject s = Make(c, *provider_);
    ASSERT_TRUE(s.drafter);
    Drafter& d = *s.drafter;
    const auto hidden = Hidden(*s.target, {tokens.begin(), tokens.end() - 1}, d.hidden_layers());
    const DrafterObservation good = Observation(1, tokens, 0, tokens.size(), hidden);
    ASSERT_TRUE(d.AddSequence(1, {}).ok());
    EXPECT_EQ(d.AddSequence(1, {}).code(), StatusCode::kAlreadyExists);
    EXPECT_EQ(d.Observe({Observation(2, tokens, 0, tokens.size(), hidden)}).code(),
              StatusCode::kNotFound);
    DrafterObservation oov = good;
    oov.tokens[3] = kVocab;
    Status s_oov = d.Observe({oov});
    EXPECT_EQ(s_oov.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s_oov.message(), HasSubstr("tokens[3]"));
    EXPECT_EQ(d.Observe({good, good}).code(), StatusCode::kInvalidArgument);
    if (!d.hidden_layers().empty()) {
      DrafterObservation short_rows = good;
      for (auto& h : short_rows.hidden) h = h.narrow(0, 0, h.size(0) - 1);
      EXPECT_EQ(d.Observe({short_rows}).code(), StatusCode::kInvalidArgument)
          << "one hidden row too few";
    }
    EXPECT_EQ(d.Propose({{.seq = 9, .max_nodes = 4, .max_depth = 4}}).status().code(),
              StatusCode::kNotFound);
    EXPECT_EQ(d.Propose({{.seq = 1, .max_nodes = 4, .max_depth = 4},
                         {.seq = 1, .max_nodes = 4, .max_depth = 4}})
                  .status()
                  .code(),
              StatusCode::kInvalidArgument);
    // Nothing observed yet: nothing (or an empty tree) to propose.
    auto before = ProposeOne(d, 1, 4, 4);
    ASSERT_TRUE(before.ok()) << before.status();
    EXPECT_TRUE(before->empty());
    ASSERT_TRUE(d.Observe({good}).ok());
    ASSERT_NO_FATAL_FAILURE(
        ExpectLikeFreshAfter(c, *provider_, d, good, "after the refused calls"));
    d.ReleaseSequence(1);
    EXPECT_EQ(d.StateBytes(), 0);
    EXPECT_EQ(d.Propose({{.seq = 1, .max_nodes = 4, .max_depth = 4}}).status().code(),
              StatusCode::kNotFound);
    EXPECT_TRUE(d.AddSequence(1, {}).ok()) << "a released sequence id can be added again";
  }
}

// Observe and Propose in one exchange keep each call's own contract: a refused observation is
// the result and changes nothing; a refused request after a good observation leaves that
// observation applied.
TEST_F(DrafterConformance, ObserveAndProposeKeepsEachCallsContract) {
  const auto tokens = RandomTokens(16, 11);
  for (const ConformanceCase& c : Cases()) {
    SCOPED_TRACE(c.label);
    Subject s = Make(c, *provider_);
    ASSERT_TRUE(s.drafter);
    Drafter& d = *s.drafter;
    const auto hidden = Hidden(*s.target, {tokens.begin(), tokens.end() - 1}, d.hidden_layers());
    const DrafterObservation good = Observation(1, tokens, 0, tokens.size(), hidden);
    ASSERT_TRUE(d.AddSequence(1, {}).ok());
    DrafterObservation oov = good;
    oov.tokens[3] = kVocab;
    Status observed = OkStatus();
    auto refused =
        d.ObserveAndPropose({oov}, {{.seq = 1, .max_nodes = 4, .max_depth = 4}}, &observed);
    EXPECT_EQ(observed.code(), StatusCode::kInvalidArgument) << observed;
    EXPECT_THAT(observed.message(), HasSubstr("tokens[3]"));
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status();
    // The same sequence asked twice is refused by the drafter itself (remote: by the service,
    // after the observation in the same exchange).
    auto twice = d.ObserveAndPropose(
        {good},
        {{.seq = 1, .max_nodes = 4, .max_depth = 4}, {.seq = 1, .max_nodes = 4, .max_depth = 4}},
        &observed);
    EXPECT_TRUE(observed.ok()) << observed;
    EXPECT_EQ(twice.status().code(), StatusCode::kInvalidArgument) << twice.status();
    Status unknown = OkStatus();
    EXPECT_EQ(d.ObserveAndPropose({}, {{.seq = 9, .max_nodes = 4, .max_depth = 4}}, &unknown)
                  .status()
                  .code(),
              StatusCode::kNotFound);
    ASSERT_NO_FATAL_FAILURE(
        ExpectLikeFreshAfter(c, *provider_, d, good, "after the refused exchanges"));
  }
}

}  // namespace
}  // namespace specula
