// ParallelSpec training on a tiny target: a short run lowers the loss for both integrations, the
// logits training computes for a prefix equal what the serving drafter drafts for it (no
// train/serve skew), a resumed run equals an uninterrupted one, and bad options are reported.
#include "common/train/parallelspec_trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "common/drafters/parallelspec/parallelspec_drafter.h"
#include "common/drafters/parallelspec/parallelspec_model.h"
#include "common/model/model_runner.h"
#include "common/model/transformer.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_model.h"
#include "tests/train/tiny_distill.h"

namespace specula {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int kRecords = 64;

class ParallelSpecTrainerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto prompts = WriteTinyTargetAndDistill(Target(), Distill(), kRecords, 40);
    ASSERT_TRUE(prompts.ok()) << prompts.status();
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string Target() { return dir_->File("target"); }
  static std::string Distill() { return dir_->File("distill.bin"); }

  static ParallelSpecTrainOptions Options(const std::string& out) {
    ParallelSpecTrainOptions o;
    o.target_dir = Target();
    o.distill_path = Distill();
    o.out_dir = out;
    o.batch_size = 4;
    o.val_records = 4;
    o.num_mask_tokens = 3;
    o.lr = {.peak_lr = 1e-2, .min_lr = 3e-4, .warmup_steps = 4, .total_steps = 80};
    o.eval_every = 0;
    o.checkpoint_every = 0;
    o.log_every = 10;
    o.seed = 1;
    o.quiet = true;
    return o;
  }

  static TempDir* dir_;
};

TempDir* ParallelSpecTrainerTest::dir_ = nullptr;

TEST_F(ParallelSpecTrainerTest, ShortRunLowersTheLossForBothIntegrations) {
  for (bool features : {true, false}) {
    TempDir out;
    ParallelSpecTrainOptions o = Options(out.File("ps"));
    o.use_target_features = features;
    o.group_fraction = 0.5;
    o.eval_every = 80;
    auto result = TrainParallelSpec(o);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_TRUE(result->finished);
    EXPECT_EQ(result->steps_done, 80);
    EXPECT_LT(result->last_loss, result->first_loss - 0.2)
        << features << ": first " << result->first_loss << " last " << result->last_loss;
    ASSERT_EQ(result->val_top1.size(), 4u);
    for (double a : result->val_top1) {
      EXPECT_GE(a, 0.0);
      EXPECT_LE(a, 1.0);
    }
    // Chance is 1 / vocab; an untrained drafter stays there.
    EXPECT_GT(result->val_top1[0], 3.0 / TinyModelConfig().vocab_size) << "depth 1 learned nothing";
    EXPECT_TRUE(std::isfinite(result->val_loss));
    EXPECT_TRUE(fs::exists(out.File("ps/config.json")));
    EXPECT_TRUE(fs::exists(out.File("ps/model.safetensors")));
    EXPECT_TRUE(fs::exists(out.File("ps/checkpoint/optimizer.pt")));
  }
}

// Training's logits for group r of a record equal the serving drafter's for the sequence whose
// last committed position is r, for a trained drafter of each integration.
TEST_F(ParallelSpecTrainerTest, TrainingLogitsEqualServingLogits) {
  for (bool features : {true, false}) {
    TempDir out;
    ParallelSpecTrainOptions o = Options(out.File("ps"));
    o.use_target_features = features;
    o.lr.total_steps = 10;
    ASSERT_TRUE(TrainParallelSpec(o).ok());
    auto runner = ModelRunner::Load(Target(), {});
    ASSERT_TRUE(runner.ok()) << runner.status();
    auto trained = LoadParallelSpecDir(out.File("ps"), (*runner)->config());
    ASSERT_TRUE(trained.ok()) << trained.status();
    std::shared_ptr<CausalLMImpl> target = (*runner)->module();
    (*trained)->SetTargetWeights(target->model->embed_tokens->weight, target->lm_head_weight());
    const std::vector<int32_t> tokens = RandomTokens(30, 9);
    const std::vector<int64_t> record(tokens.begin(), tokens.end());
    const std::vector<int64_t> groups = {0, 5, 17, 26};
    at::Tensor training = ParallelSpecTrainingLogits(**trained, *target, record, groups);
    ASSERT_EQ(training.size(0), 4);
    ASSERT_EQ(training.size(1), 4);

    auto drafter = ParallelSpecDrafter::Load(out.File("ps"), **runner);
    ASSERT_TRUE(drafter.ok()) << drafter.status();
    for (size_t g = 0; g < groups.size(); ++g) {
      const int64_t r = groups[g];
      // Committed positions 0..r, pending token x_{r+1}.
      std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + r + 2);
      const SeqId seq = 10 + static_cast<SeqId>(g);
      ASSERT_TRUE((*drafter)->AddSequence(seq, {}).ok());
      DrafterObservation obs{.seq = seq, .tokens = prefix};
      if (features) {
        torch::NoGradGuard no_grad;
        auto ids = torch::tensor(std::vector<int64_t>(prefix.begin(), prefix.end() - 1));
        const int64_t n = ids.size(0);
        auto in = target->DenseCausalInputs(1, n, torch::arange(n, torch::kLong));
        obs.hidden = target->forward(ids, in, nullptr, (*drafter)->hidden_layers()).hidden_states;
      }
      ASSERT_TRUE((*drafter)->Observe({obs}).ok());
      auto serving = (*drafter)->DepthLogitsOf(seq);
      ASSERT_TRUE(serving.ok()) << serving.status();
      EXPECT_TRUE(torch::allclose(*serving, training[g], 1e-3, 1e-3))
          << "features " << features << " group " << r << ": max diff "
          << (*serving - training[g]).abs().max().item<float>();
    }
  }
}

TEST_F(ParallelSpecTrainerTest, ResumeEqualsUninterrupted) {
  TempDir out;
  ParallelSpecTrainOptions full = Options(out.File("full"));
  full.lr.total_steps = 12;
  ASSERT_TRUE(TrainParallelSpec(full).ok());
  ParallelSpecTrainOptions part = full;
  part.out_dir = out.File("part");
  part.max_steps_this_run = 5;
  for (int64_t expected : {5, 10}) {
    auto r = TrainParallelSpec(part);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->finished);
    EXPECT_EQ(r->steps_done, expected);
  }
  auto last = TrainParallelSpec(part);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(last->finished);
  auto a = LoadParallelSpecDir(out.File("full"), TinyModelConfig());
  auto b = LoadParallelSpecDir(out.File("part"), TinyModelConfig());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  auto pb = (*b)->named_parameters();
  for (const auto& p : (*a)->named_parameters()) {
    EXPECT_TRUE(torch::allclose(p.value(), pb[p.key()], 1e-5, 1e-6)) << p.key();
  }
  ParallelSpecTrainOptions changed = part;
  changed.max_steps_this_run = 0;
  changed.num_mask_tokens = 2;
  changed.lr.total_steps = 20;
  auto mismatch = TrainParallelSpec(changed);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_THAT(mismatch.status().message(), HasSubstr("config differs"));
}

TEST_F(ParallelSpecTrainerTest, BadOptionsAreReported) {
  TempDir out;
  ParallelSpecTrainOptions o = Options(out.File("x"));
  o.group_fraction = 0;
  EXPECT_THAT(TrainParallelSpec(o).status().message(), HasSubstr("group_fraction"));
  o = Options(out.File("x"));
  o.noise_std = -1;
  EXPECT_THAT(TrainParallelSpec(o).status().message(), HasSubstr("noise_std"));
  o = Options(out.File("x"));
  o.num_mask_tokens = 0;
  EXPECT_THAT(TrainParallelSpec(o).status().message(), HasSubstr("num_mask_tokens"));
  o = Options(out.File("x"));
  o.distill_path = out.File("missing.bin");
  EXPECT_EQ(TrainParallelSpec(o).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace specula
