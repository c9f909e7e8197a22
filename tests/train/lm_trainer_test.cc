#include "common/train/lm_trainer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "common/model/checkpoint.h"
#include "common/train/lr_schedule.h"
#include "common/train/token_file.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_model.h"

namespace specula {
namespace {

namespace fs = std::filesystem;

class LmTrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A learnable stream: token t+1 = (3 * t + 1) mod 61 most of the time, else random.
    std::mt19937 rng(7);
    std::vector<int32_t> tokens{1};
    for (int i = 0; i < 20000; ++i) {
      tokens.push_back(rng() % 10 == 0 ? static_cast<int32_t>(rng() % 64)
                                       : (3 * tokens.back() + 1) % 61);
    }
    ASSERT_TRUE(WriteTokenFile(dir_.File("train.tok"), tokens).ok());
    tokens.resize(3000);
    ASSERT_TRUE(WriteTokenFile(dir_.File("val.tok"), tokens).ok());
  }

  ModelConfig TinyConfig() const {
    ModelConfig c = TinyModelConfig();
    c.max_position_embeddings = 64;
    c.tie_word_embeddings = true;
    return c;
  }

  LmTrainOptions Options(const std::string& out, int64_t steps) const {
    LmTrainOptions o;
    o.train_tokens = dir_.File("train.tok");
    o.val_tokens = dir_.File("val.tok");
    o.out_dir = dir_.File(out);
    o.batch_size = 8;
    o.seq_len = 32;
    o.lr = {.peak_lr = 1e-2, .min_lr = 1e-3, .warmup_steps = 2, .total_steps = steps};
    o.eval_every = steps;
    o.eval_batches = 4;
    o.checkpoint_every = 0;
    o.log_every = 1000;
    o.seed = 3;
    o.quiet = true;
    return o;
  }

  TempDir dir_;
};

TEST_F(LmTrainerTest, LossFalls) {
  LmTrainOptions o = Options("short", 1);
  auto first = TrainLanguageModel(TinyConfig(), o);
  ASSERT_TRUE(first.ok()) << first.status();
  o = Options("long", 60);
  auto trained = TrainLanguageModel(TinyConfig(), o);
  ASSERT_TRUE(trained.ok()) << trained.status();
  EXPECT_TRUE(trained->finished);
  EXPECT_EQ(trained->tokens_seen, 60 * 8 * 32);
  // Untrained loss is about ln(64) = 4.16; the stream is ~90% deterministic.
  EXPECT_GT(first->last_val_loss, 3.5);
  EXPECT_LT(trained->last_val_loss, first->last_val_loss - 1.5);
  EXPECT_TRUE(fs::exists(dir_.path() / "long" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(dir_.path() / "long" / "config.json"));

  // Same windows as the trainer's validation: eval_batches * batch_size of them.
  auto reloaded = EvaluateModelLoss(dir_.File("long"), dir_.File("val.tok"), 32, 8, 32);
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_NEAR(*reloaded, trained->last_val_loss, 1e-4);
}

TEST_F(LmTrainerTest, ResumeReproducesUninterruptedRun) {
  auto straight = TrainLanguageModel(TinyConfig(), Options("straight", 8));
  ASSERT_TRUE(straight.ok()) << straight.status();

  LmTrainOptions o = Options("resumed", 8);
  o.max_steps_this_run = 3;
  auto part1 = TrainLanguageModel(TinyConfig(), o);
  ASSERT_TRUE(part1.ok()) << part1.status();
  EXPECT_FALSE(part1->finished);
  EXPECT_EQ(part1->steps_done, 3);
  EXPECT_TRUE(fs::exists(dir_.path() / "resumed" / "checkpoint" / "state.json"));
  o.max_steps_this_run = 0;
  auto part2 = TrainLanguageModel(TinyConfig(), o);
  ASSERT_TRUE(part2.ok()) << part2.status();
  EXPECT_TRUE(part2->finished);

  auto a = LoadSafetensorsFile(dir_.File("straight/model.safetensors"));
  auto b = LoadSafetensorsFile(dir_.File("resumed/model.safetensors"));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  for (const auto& [name, tensor] : *a) {
    ASSERT_TRUE(b->count(name)) << name;
    EXPECT_TRUE(torch::equal(tensor, b->at(name))) << name << " differs after resume";
  }
}

// Fine-tuning starts from the given weights: a zero learning rate leaves them as they were (so the
// run's validation loss is the trained model's, far below a fresh init's); a missing directory is
// refused naming init_from.
TEST_F(LmTrainerTest, InitFromStartsFromTheGivenWeights) {
  auto trained = TrainLanguageModel(TinyConfig(), Options("base", 40));
  ASSERT_TRUE(trained.ok()) << trained.status();
  auto fresh = TrainLanguageModel(TinyConfig(), [&] {
    LmTrainOptions o = Options("fresh", 1);
    o.lr = {.peak_lr = 0, .min_lr = 0, .warmup_steps = 0, .total_steps = 1};
    return o;
  }());
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  LmTrainOptions o = Options("tuned", 1);
  o.lr = {.peak_lr = 0, .min_lr = 0, .warmup_steps = 0, .total_steps = 1};
  o.weight_decay = 0;
  o.init_from = dir_.File("base");
  auto tuned = TrainLanguageModel(TinyConfig(), o);
  ASSERT_TRUE(tuned.ok()) << tuned.status();
  EXPECT_NEAR(tuned->last_val_loss, trained->last_val_loss, 1e-4);
  EXPECT_LT(tuned->last_val_loss, fresh->last_val_loss - 1.0);
  auto a = LoadSafetensorsFile(dir_.File("base/model.safetensors"));
  auto b = LoadSafetensorsFile(dir_.File("tuned/model.safetensors"));
  ASSERT_TRUE(a.ok() && b.ok());
  for (const auto& [name, tensor] : *a) EXPECT_TRUE(torch::equal(tensor, b->at(name))) << name;

  o.init_from = dir_.File("missing");
  o.out_dir = dir_.File("tuned-missing");
  auto missing = TrainLanguageModel(TinyConfig(), o);
  EXPECT_FALSE(missing.ok());
  EXPECT_NE(missing.status().ToString().find("init_from"), std::string::npos) << missing.status();
}

TEST_F(LmTrainerTest, RejectsBadOptions) {
  LmTrainOptions o = Options("bad", 2);
  o.seq_len = 1000;  // over max_position_embeddings
  EXPECT_EQ(TrainLanguageModel(TinyConfig(), o).status().code(), StatusCode::kInvalidArgument);
  o = Options("bad", 2);
  o.train_tokens = dir_.File("missing.tok");
  EXPECT_EQ(TrainLanguageModel(TinyConfig(), o).status().code(), StatusCode::kNotFound);
  ModelConfig small_vocab = TinyConfig();
  small_vocab.vocab_size = 16;  // the stream has ids up to 63
  auto r = TrainLanguageModel(small_vocab, Options("bad", 2));
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("vocab_size"), std::string::npos) << r.status();
}

TEST(LrScheduleTest, WarmupThenCosine) {
  LrSchedule s{.peak_lr = 1.0, .min_lr = 0.1, .warmup_steps = 10, .total_steps = 110};
  EXPECT_DOUBLE_EQ(s.At(0), 0.1);
  EXPECT_DOUBLE_EQ(s.At(9), 1.0);
  EXPECT_DOUBLE_EQ(s.At(10), 1.0);
  EXPECT_NEAR(s.At(60), 0.55, 1e-12);  // half way down the cosine
  EXPECT_DOUBLE_EQ(s.At(110), 0.1);
  EXPECT_DOUBLE_EQ(s.At(500), 0.1);
}

TEST(LrScheduleTest, WarmupThenInverseSqrt) {
  LrSchedule s{
      .peak_lr = 1.0, .min_lr = 0.5, .warmup_steps = 4, .total_steps = 100, .inverse_sqrt = true};
  EXPECT_DOUBLE_EQ(s.At(0), 0.25);
  EXPECT_DOUBLE_EQ(s.At(3), 1.0);
  EXPECT_DOUBLE_EQ(s.At(15), 0.5);   // sqrt(4 / 16)
  EXPECT_DOUBLE_EQ(s.At(399), 0.1);  // sqrt(4 / 400): min_lr does not apply
}

TEST(TokenFileTest, RoundTripAndErrors) {
  TempDir dir;
  const std::string path = dir.File("t.tok");
  ASSERT_TRUE(WriteTokenFile(path, {0, 1, 65535, 300}).ok());
  auto t = TokenFile::Open(path);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 4);
  EXPECT_EQ((*t)[2], 65535);
  EXPECT_EQ((*t)[3], 300);
  EXPECT_EQ(WriteTokenFile(path, {70000}).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(WriteStringToFile(path, "abc").ok());
  EXPECT_EQ(TokenFile::Open(path).status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace specula
