// SpecFormer training on a tiny target: a short self-distillation run lowers the loss, writes a
// checkpoint that SpecFormerDrafter serves losslessly with more accepted drafts than an untrained
// drafter, resumes to the same weights as an uninterrupted run, and the raw-corpus ablation trains.
#include "common/train/specformer_trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "common/drafters/specformer/specformer_drafter.h"
#include "common/drafters/specformer/specformer_model.h"
#include "common/engine/plain_decoder.h"
#include "common/model/model_runner.h"
#include "common/model/transformer.h"
#include "common/spec/spec_engine.h"
#include "common/train/distill_dataset.h"
#include "common/train/token_file.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_model.h"
#include "tests/train/tiny_distill.h"

namespace specula {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int kRecords = 24;

class SpecFormerTrainerTest : public ::testing::Test {
 protected:
  // A tiny target directory and a self-distillation dataset of its greedy continuations.
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto prompts = WriteTinyTargetAndDistill(Target(), Distill(), kRecords, 40);
    ASSERT_TRUE(prompts.ok()) << prompts.status();
    prompts_ = new std::vector<std::vector<int32_t>>(std::move(*prompts));
  }
  static void TearDownTestSuite() {
    delete prompts_;
    delete dir_;
  }
  static std::string Target() { return dir_->File("target"); }
  static std::string Distill() { return dir_->File("distill.bin"); }

  static SpecFormerTrainOptions Options(const std::string& out) {
    SpecFormerTrainOptions o;
    o.target_dir = Target();
    o.distill_path = Distill();
    o.out_dir = out;
    o.draft_len = 4;
    o.batch_size = 4;
    o.val_records = 4;
    o.lr = {.peak_lr = 3e-3, .min_lr = 1e-4, .warmup_steps = 5, .total_steps = 80};
    o.eval_every = 40;
    o.checkpoint_every = 0;
    o.log_every = 1000;
    o.seed = 1;
    o.quiet = true;
    return o;
  }

  // Mean accepted draft tokens per step of a drafter over the training prompts (greedy, k = 4);
  // every output must equal plain greedy decoding.
  static double Acceptance(std::unique_ptr<SpecFormerDrafter> drafter, ModelRunner& target) {
    SpecEngine engine(&target);
    EXPECT_TRUE(engine.AddDrafter(std::move(drafter)).ok());
    std::vector<SpecRequest> batch;
    std::vector<GenerationRequest> plain;
    for (const auto& p : *prompts_) {
      plain.push_back({.prompt = p, .max_new_tokens = 24});
      batch.push_back({.generation = plain.back(),
                       .speculation = {.drafter = "specformer", .max_draft_tokens = 4}});
    }
    auto out = GenerateAll(engine, batch);
    EXPECT_TRUE(out.ok()) << out.status();
    int64_t accepted = 0, steps = 0;
    for (size_t i = 0; i < plain.size(); ++i) {
      auto ref = DecodeBatch(target, {plain[i]});
      EXPECT_EQ((*out)[i].result.tokens, (*ref)[0].tokens) << "prompt " << i;
      accepted += (*out)[i].stats.accepted_tokens;
      steps += (*out)[i].stats.steps;
    }
    return static_cast<double>(accepted) / static_cast<double>(steps);
  }

  static TempDir* dir_;
  static std::vector<std::vector<int32_t>>* prompts_;
};

TempDir* SpecFormerTrainerTest::dir_ = nullptr;
std::vector<std::vector<int32_t>>* SpecFormerTrainerTest::prompts_ = nullptr;

TEST_F(SpecFormerTrainerTest, ShortRunLowersLossAndServesBetterThanUntrained) {
  TempDir out;
  auto result = TrainSpecFormer(Options(out.File("sf")));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->finished);
  EXPECT_EQ(result->steps_done, 80);
  EXPECT_LT(result->last_loss, 0.7 * result->first_loss)
      << "first " << result->first_loss << " last " << result->last_loss;
  ASSERT_EQ(result->val_slot_accuracy.size(), 4u);
  EXPECT_TRUE(fs::exists(out.File("sf/config.json")));
  EXPECT_TRUE(fs::exists(out.File("sf/model.safetensors")));
  EXPECT_TRUE(fs::exists(out.File("sf/checkpoint/optimizer.pt")));

  auto target = ModelRunner::Load(Target(), {});
  ASSERT_TRUE(target.ok());
  auto trained = SpecFormerDrafter::Load(out.File("sf"), **target);
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_EQ((*trained)->config().draft_len, 4);
  const double trained_a = Acceptance(std::move(*trained), **target);

  auto untrained_module = std::make_shared<SpecFormerImpl>(
      SpecFormerConfig::ForTarget(TinyModelConfig(), 4), TinyModelConfig());
  untrained_module->InitWeights(1);
  auto untrained = SpecFormerDrafter::Create(untrained_module, **target);
  ASSERT_TRUE(untrained.ok()) << untrained.status();
  const double untrained_a = Acceptance(std::move(*untrained), **target);
  EXPECT_GT(trained_a, untrained_a + 0.3)
      << "trained " << trained_a << " vs untrained " << untrained_a;
}

// The pending-token extension trains on row t + 1's token exactly as serving feeds it (an
// off-by-one would teach slot 0 to copy its own label and serve far worse than it validates).
TEST_F(SpecFormerTrainerTest, PendingTokenRunServesWhatItValidates) {
  TempDir out;
  SpecFormerTrainOptions o = Options(out.File("sf"));
  o.pending_token = true;
  auto result = TrainSpecFormer(o);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->val_slot_accuracy.size(), 4u);
  EXPECT_LT(result->val_slot_accuracy[0], 0.99) << "slot 0 sees its own label";
  auto target = ModelRunner::Load(Target(), {});
  ASSERT_TRUE(target.ok());
  auto trained = SpecFormerDrafter::Load(out.File("sf"), **target);
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_TRUE((*trained)->config().pending_token);
  auto untrained_module = std::make_shared<SpecFormerImpl>((*trained)->config(), TinyModelConfig());
  untrained_module->InitWeights(1);
  auto untrained = SpecFormerDrafter::Create(untrained_module, **target);
  ASSERT_TRUE(untrained.ok()) << untrained.status();
  const double trained_a = Acceptance(std::move(*trained), **target);
  const double untrained_a = Acceptance(std::move(*untrained), **target);
  EXPECT_GT(trained_a, untrained_a + 0.3)
      << "trained " << trained_a << " vs untrained " << untrained_a;
}

TEST_F(SpecFormerTrainerTest, ResumeEqualsUninterrupted) {
  TempDir out;
  SpecFormerTrainOptions full = Options(out.File("full"));
  full.lr.total_steps = 20;
  full.position_fraction = 0.5;
  ASSERT_TRUE(TrainSpecFormer(full).ok());
  SpecFormerTrainOptions part = full;
  part.out_dir = out.File("part");
  part.max_steps_this_run = 12;
  auto first = TrainSpecFormer(part);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->finished);
  EXPECT_EQ(first->steps_done, 12);
  auto second = TrainSpecFormer(part);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->finished);
  auto a = LoadSpecFormerDir(out.File("full"), TinyModelConfig());
  auto b = LoadSpecFormerDir(out.File("part"), TinyModelConfig());
  ASSERT_TRUE(a.ok() && b.ok());
  auto pb = (*b)->named_parameters();
  for (const auto& p : (*a)->named_parameters()) {
    EXPECT_TRUE(torch::allclose(p.value(), pb[p.key()], 1e-5, 1e-6)) << p.key();
  }
  // A changed shape cannot resume the checkpoint.
  SpecFormerTrainOptions other = part;
  other.max_steps_this_run = 0;
  other.draft_len = 3;
  other.lr.total_steps = 30;
  auto refused = TrainSpecFormer(other);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("config differs"));
}

TEST_F(SpecFormerTrainerTest, RawCorpusAblationTrains) {
  TempDir out;
  ASSERT_TRUE(WriteTokenFile(out.File("raw.tok"), RandomTokens(3000, 9)).ok());
  SpecFormerTrainOptions o = Options(out.File("raw"));
  o.distill_path.clear();
  o.raw_tokens = out.File("raw.tok");
  o.raw_records = 16;
  o.raw_response_tokens = 24;
  o.lr.total_steps = 10;
  auto result = TrainSpecFormer(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->finished);
  EXPECT_TRUE(std::isfinite(result->last_loss));
}

TEST_F(SpecFormerTrainerTest, BadInputsAreReported) {
  TempDir out;
  SpecFormerTrainOptions o = Options(out.File("x"));
  o.distill_path = out.File("missing.bin");
  EXPECT_EQ(TrainSpecFormer(o).status().code(), StatusCode::kNotFound);
  o = Options(out.File("x"));
  o.position_fraction = 0;
  EXPECT_THAT(TrainSpecFormer(o).status().message(), HasSubstr("position_fraction"));
  // A dataset of another vocabulary.
  size_t present = 0;
  auto w = DistillWriter::OpenForAppend(out.File("v.bin"), 1000, &present);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append({1, 2}, {3, 4}).ok());
  w->reset();
  o = Options(out.File("x"));
  o.distill_path = out.File("v.bin");
  EXPECT_THAT(TrainSpecFormer(o).status().message(), HasSubstr("vocabulary"));
}

}  // namespace
}  // namespace specula
