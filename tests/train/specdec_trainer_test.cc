// SpecDec training on a tiny target's self-distillation data: a short run (with glancing) lowers
// the loss and writes a checkpoint SpecDecDrafter serves losslessly, and training after a resume
// gives the weights of an uninterrupted run; bad options are named.
#include "common/train/specdec_trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/drafters/specdec/specdec_drafter.h"
#include "common/drafters/specdec/specdec_model.h"
#include "common/engine/plain_decoder.h"
#include "common/model/model_runner.h"
#include "common/spec/spec_engine.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_model.h"
#include "tests/train/tiny_distill.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

constexpr int kRecords = 24;

class SpecDecTrainerTest : public ::testing::Test {
 protected:
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

  static SpecDecTrainOptions Options(const std::string& out) {
    SpecDecTrainOptions o;
    o.target_dir = Target();
    o.distill_path = Distill();
    o.out_dir = out;
    o.hidden_size = 32;
    o.encoder_layers = 2;
    o.decoder_layers = 1;
    o.num_slots = 4;
    o.num_attention_heads = 4;
    o.num_key_value_heads = 2;
    o.head_dim = 8;
    o.intermediate_size = 64;
    o.splits_per_record = 8;
    o.glancing_ratio = 0.5;
    o.batch_size = 4;
    o.val_records = 4;
    o.beta2 = 0.999;
    o.adam_eps = 1e-6;
    o.lr = {
        .peak_lr = 3e-3, .min_lr = 0, .warmup_steps = 5, .total_steps = 60, .inverse_sqrt = true};
    o.eval_every = 30;
    o.checkpoint_every = 0;
    o.log_every = 1000;
    o.seed = 1;
    o.quiet = true;
    return o;
  }

  static TempDir* dir_;
  static std::vector<std::vector<int32_t>>* prompts_;
};
TempDir* SpecDecTrainerTest::dir_ = nullptr;
std::vector<std::vector<int32_t>>* SpecDecTrainerTest::prompts_ = nullptr;

TEST_F(SpecDecTrainerTest, TrainsAndServesLosslessly) {
  const std::string out = dir_->File("run");
  auto result = TrainSpecDec(Options(out));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->finished);
  EXPECT_LT(result->last_loss, result->first_loss);
  ASSERT_EQ(result->val_slot_accuracy.size(), 4u);
  EXPECT_TRUE(std::isfinite(result->val_loss));

  ModelRunnerOptions ro;
  ro.kv.block_size = 4;
  ro.kv.num_blocks = 256;
  auto target = ModelRunner::Load(Target(), ro);
  ASSERT_TRUE(target.ok()) << target.status();
  auto drafter =
      SpecDecDrafter::Load(out, (*target)->config(), {.kv = {.block_size = 4, .num_blocks = 256}});
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  SpecEngine engine(target->get());
  ASSERT_TRUE(engine.AddDrafter(std::move(*drafter)).ok());
  for (size_t i = 0; i < 4; ++i) {
    const GenerationRequest g{.prompt = (*prompts_)[i], .max_new_tokens = 24};
    auto plain = DecodeBatch(**target, {g});
    ASSERT_TRUE(plain.ok());
    auto spec = GenerateAll(
        engine, {{.generation = g, .speculation = {.drafter = "specdec", .max_draft_tokens = 4}}});
    ASSERT_TRUE(spec.ok()) << spec.status();
    EXPECT_EQ((*spec)[0].result.tokens, (*plain)[0].tokens) << i;
  }
}

TEST_F(SpecDecTrainerTest, ResumeGivesTheUninterruptedWeights) {
  SpecDecTrainOptions whole = Options(dir_->File("whole"));
  whole.lr.total_steps = 12;
  whole.val_records = 0;
  SpecDecTrainOptions split = whole;
  split.out_dir = dir_->File("split");
  split.checkpoint_every = 5;
  split.max_steps_this_run = 7;
  ASSERT_TRUE(TrainSpecDec(whole).ok());
  auto first = TrainSpecDec(split);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->finished);
  split.max_steps_this_run = 0;
  auto second = TrainSpecDec(split);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->finished);
  ModelConfig target = *ModelConfig::FromFile(Target() + "/config.json");
  auto a = LoadSpecDecDir(whole.out_dir, target);
  auto b = LoadSpecDecDir(split.out_dir, target);
  ASSERT_TRUE(a.ok() && b.ok());
  for (const auto& p : (*a)->named_parameters()) {
    EXPECT_TRUE(torch::allclose(p.value(), (*b)->named_parameters()[p.key()], 1e-5, 1e-6))
        << p.key();
  }
}

TEST_F(SpecDecTrainerTest, BadOptionsAreNamed) {
  auto expect_invalid = [](const SpecDecTrainOptions& o, const std::string& field) {
    auto r = TrainSpecDec(o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr(field));
  };
  SpecDecTrainOptions o = Options(dir_->File("bad"));
  o.glancing_ratio = 1.5;
  expect_invalid(o, "glancing_ratio");
  o = Options(dir_->File("bad"));
  o.splits_per_record = 0;
  expect_invalid(o, "splits_per_record");
  o = Options(dir_->File("bad"));
  o.label_smoothing = -0.1;
  expect_invalid(o, "label_smoothing");
  o = Options(dir_->File("bad"));
  o.num_slots = 0;
  expect_invalid(o, "num_slots");
}

}  // namespace
}  // namespace specula
