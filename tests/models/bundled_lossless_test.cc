// Greedy speculative decoding on the bundled target equals plain greedy decoding token for token:
// held-out prompts of mixed lengths, every drafter (n-gram, the draft LM as a chain and as a tree,
// the trained SpecFormer as a chain and as a budgeted tree), draft lengths 1-8, batch sizes 1
// and 8. On the device SPECULA_TEST_DEVICE names (the CPU in CI; a GPU where there is one).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "common/drafters/drafter_registry.h"
#include "common/engine/plain_decoder.h"
#include "common/sampling/sampler.h"
#include "common/spec/spec_engine.h"
#include "common/tokenizer/tokenizer.h"
#include "common/util/mapped_file.h"
#include "tests/testing/test_device.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

const std::string kTarget = std::string(SPECULA_SOURCE_DIR) + "/models/pyllama-6m";
const std::string kDraft = std::string(SPECULA_SOURCE_DIR) + "/models/pyllama-draft-1m";
const std::string kSpecFormer = std::string(SPECULA_SOURCE_DIR) + "/models/specformer-pyllama-6m";
const std::string kBeagle = std::string(SPECULA_SOURCE_DIR) + "/models/beagle-pyllama-6m";
const std::string kParallelSpec =
    std::string(SPECULA_SOURCE_DIR) + "/models/parallelspec-pyllama-6m";
const std::string kSpecDec = std::string(SPECULA_SOURCE_DIR) + "/models/specdec-pyllama-6m";
const std::string kHeldOut = "/usr/lib/python3.11/test";
constexpr int kPrompts = 16;
constexpr int64_t kMaxNewTokens = 40;

ModelRunnerOptions DeviceOptions() {
  ModelRunnerOptions options;
  options.device = TestDeviceName();
  return options;
}

class BundledLosslessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto target = ModelRunner::Load(kTarget, DeviceOptions());
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = target->release();
    auto tok = Tokenizer::FromFile(kTarget + "/tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status();
    // Prefixes of 8..120 tokens from the first held-out files, so batches mix prompt lengths.
    std::vector<fs::path> files;
    for (const auto& e : fs::recursive_directory_iterator(kHeldOut)) {
      if (e.is_regular_file() && e.path().extension() == ".py") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    requests_ = new std::vector<GenerationRequest>();
    for (const auto& f : files) {
      if (static_cast<int>(requests_->size()) == kPrompts) break;
      auto ids = (*tok)->Encode(ReadFileToString(f.string()).value(), false);
      const size_t len = 8 + (requests_->size() * 37) % 113;
      if (ids.size() < len) continue;
      ids.resize(len);
      requests_->push_back({.prompt = ids,
                            .max_new_tokens = kMaxNewTokens,
                            .stop_token_ids = target_->config().eos_token_ids});
    }
    ASSERT_EQ(static_cast<int>(requests_->size()), kPrompts);
    plain_ = new std::vector<std::vector<int32_t>>();
    for (const auto& r : *requests_) {  // batch 1: the plainest reference there is
      auto out = DecodeBatch(*target_, {r});
      ASSERT_TRUE(out.ok()) << out.status();
      plain_->push_back((*out)[0].tokens);
    }
  }
  static void TearDownTestSuite() {
    std::printf("floating-point ties at a divergence: %d\n", ties_);
    delete target_;
    delete requests_;
    delete plain_;
  }

  // A fresh engine with the case's drafter, loaded through the drafter registry as the CLI
  // loads it. A case is a registry name, or "specformer-chain" / "draft-model-tree" for that
  // drafter with its other shape; a "+vocab" suffix adds the bundled draft vocabulary
  // (--draft-vocab). Returns the engine and the drafter's name.
  static std::pair<std::unique_ptr<SpecEngine>, std::string> Engine(std::string drafter) {
    auto engine = std::make_unique<SpecEngine>(target_);
    DrafterRegistry registry = BuiltinDrafterRegistry();
    FlagSet flags("bundled");
    registry.RegisterFlags(flags);
    std::vector<std::string> args = {
        "--drafter-model=" + kDraft,
        "--specformer-model=" + kSpecFormer,
        "--beagle-model=" + kBeagle,
        "--parallelspec-model=" + kParallelSpec,
        "--parallelspec-static-tree=" + kParallelSpec + "/medusa_tree.json",
        "--specdec-model=" + kSpecDec};
    if (const size_t plus = drafter.find("+vocab"); plus != std::string::npos) {
      drafter.erase(plus);
      args.push_back("--draft-vocab=" + kTarget + "/draft_vocab.json");
    }
    std::string name = drafter;
    if (drafter.rfind("specformer", 0) == 0) {
      name = "specformer";
      args.push_back(drafter == "specformer-tree" ? "--specformer-tree=true"
                                                  : "--specformer-tree=false");
    } else if (drafter == "draft-model-tree") {
      name = "draft-model";
      args.push_back("--tree-width=2");
    }
    Status parsed = flags.Parse(args);
    EXPECT_TRUE(parsed.ok()) << parsed;
    DrafterLoadContext context(*target_, DeviceOptions());
    auto loaded = registry.Load(name, context);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    if (loaded.ok()) {
      EXPECT_TRUE(engine->AddDrafter(std::move(*loaded)).ok());
    }
    return {std::move(engine), name};
  }

  // Equal, or diverging only where the target's top-2 logits are a floating-point tie (a batched
  // tree forward and a one-token decode may round differently; then both tokens are "greedy").
  static void ExpectSameOrTie(const GenerationRequest& request, const std::vector<int32_t>& plain,
                              const std::vector<int32_t>& got, const std::string& what) {
    if (plain == got) return;
    size_t j = 0;
    while (j < plain.size() && j < got.size() && plain[j] == got[j]) ++j;
    ASSERT_LT(j, std::min(plain.size(), got.size())) << what << ": one output is a prefix";
    auto runner = ModelRunner::Load(kTarget, DeviceOptions());
    ASSERT_TRUE(runner.ok());
    std::vector<int32_t> context = request.prompt;
    context.insert(context.end(), plain.begin(), plain.begin() + static_cast<int64_t>(j));
    ASSERT_TRUE((*runner)->AddSequence(1).ok());
    auto out = (*runner)->Forward({.seqs = {{.seq = 1, .tokens = context}}});
    ASSERT_TRUE(out.ok());
    const at::Tensor logits = out->logits.to(at::kCPU, at::kFloat).contiguous();
    const float* row = logits.data_ptr<float>();
    const float a = row[plain[j]];
    const float b = row[got[j]];
    ++ties_;
    EXPECT_LT(std::abs(a - b), 1e-4f)
        << what << ": diverges at token " << j << " (" << plain[j] << " vs " << got[j]
        << ") with logits " << a << " vs " << b << ", not a tie";
  }

  void CheckDrafter(const std::string& drafter,
                    const std::vector<int32_t>& budgets = {1, 2, 3, 4, 5, 6, 7, 8}) {
    auto [engine, name] = Engine(drafter);
    int64_t accepted = 0;
    for (int32_t k : budgets) {
      // Batch 1: a few prompts one at a time.
      for (int i = 0; i < 4; ++i) {
        SpecRequest r{.generation = (*requests_)[i],
                      .speculation = {.drafter = name, .max_draft_tokens = k}};
        auto out = GenerateAll(*engine, {r});
        ASSERT_TRUE(out.ok()) << out.status();
        ExpectSameOrTie(
            (*requests_)[i], (*plain_)[i], (*out)[0].result.tokens,
            drafter + " k=" + std::to_string(k) + " batch 1 prompt " + std::to_string(i));
        accepted += (*out)[0].stats.accepted_tokens;
        // A failed draft falls back to plain decoding, which would hide a broken drafter here.
        EXPECT_EQ((*out)[0].stats.draft_errors, 0)
            << drafter << " k=" << k << ": " << (*out)[0].stats.last_draft_error;
      }
      // Batch 8: all prompts, mixed lengths, each accepting its own number of tokens per step.
      for (int b = 0; b < kPrompts; b += 8) {
        std::vector<SpecRequest> batch;
        for (int i = b; i < b + 8; ++i) {
          batch.push_back({.generation = (*requests_)[i],
                           .speculation = {.drafter = name, .max_draft_tokens = k}});
        }
        auto out = GenerateAll(*engine, batch);
        ASSERT_TRUE(out.ok()) << out.status();
        for (int i = b; i < b + 8; ++i) {
          ExpectSameOrTie(
              (*requests_)[i], (*plain_)[i], (*out)[i - b].result.tokens,
              drafter + " k=" + std::to_string(k) + " batch 8 prompt " + std::to_string(i));
          accepted += (*out)[i - b].stats.accepted_tokens;
          EXPECT_EQ((*out)[i - b].stats.draft_errors, 0)
              << drafter << " k=" << k << ": " << (*out)[i - b].stats.last_draft_error;
        }
      }
    }
    EXPECT_GT(accepted, 0) << drafter << " never had a draft token accepted";
    EXPECT_EQ(target_->kv_stats().free_blocks, target_->kv_stats().num_blocks);
  }

  static ModelRunner* target_;
  static std::vector<GenerationRequest>* requests_;
  static std::vector<std::vector<int32_t>>* plain_;
  static int ties_;
};

ModelRunner* BundledLosslessTest::target_ = nullptr;
std::vector<GenerationRequest>* BundledLosslessTest::requests_ = nullptr;
std::vector<std::vector<int32_t>>* BundledLosslessTest::plain_ = nullptr;
int BundledLosslessTest::ties_ = 0;

TEST_F(BundledLosslessTest, NgramEqualsPlainGreedy) { CheckDrafter("ngram"); }
TEST_F(BundledLosslessTest, DraftModelChainEqualsPlainGreedy) { CheckDrafter("draft-model"); }
TEST_F(BundledLosslessTest, DraftModelTreeEqualsPlainGreedy) { CheckDrafter("draft-model-tree"); }
TEST_F(BundledLosslessTest, SpecFormerChainEqualsPlainGreedy) { CheckDrafter("specformer-chain"); }
TEST_F(BundledLosslessTest, SpecFormerTreeEqualsPlainGreedy) { CheckDrafter("specformer-tree"); }
TEST_F(BundledLosslessTest, SpecDecChainEqualsPlainGreedy) { CheckDrafter("specdec"); }
TEST_F(BundledLosslessTest, BeagleChainEqualsPlainGreedy) {
  CheckDrafter("beagle-chain", {1, 3, 6});
}
// Dynamic trees from one node up to the paper's 60.
TEST_F(BundledLosslessTest, BeagleDynamicTreeEqualsPlainGreedy) {
  CheckDrafter("beagle", {1, 4, 16, 60});
}
// The heads cut to the bundled draft vocabulary (the 1,024 tokens the target emits most).
TEST_F(BundledLosslessTest, DraftVocabularyKeepsOutputsEqualToPlainGreedy) {
  CheckDrafter("draft-model+vocab", {2, 4});
  CheckDrafter("specformer-tree+vocab", {2, 4, 8});
  CheckDrafter("beagle+vocab", {4, 16});
  CheckDrafter("parallelspec-chain+vocab", {3, 5});
}

// ParallelSpec (target features, k = 4): argmax chains up to its k + 1 depths and budgeted
// best-first trees.
TEST_F(BundledLosslessTest, ParallelSpecChainEqualsPlainGreedy) {
  CheckDrafter("parallelspec-chain", {1, 3, 5});
}
TEST_F(BundledLosslessTest, ParallelSpecTreeEqualsPlainGreedy) {
  CheckDrafter("parallelspec", {1, 4, 8, 16});
}
TEST_F(BundledLosslessTest, ParallelSpecStaticTreeEqualsPlainGreedy) {
  CheckDrafter("parallelspec-static", {1, 4, 16});
}
// The same network drafting autoregressively (its features fed back): the paper's baseline.
TEST_F(BundledLosslessTest, ParallelSpecAutoregressiveEqualsPlainGreedy) {
  CheckDrafter("parallelspec-ar", {1, 3, 5});
}

}  // namespace
}  // namespace specula
