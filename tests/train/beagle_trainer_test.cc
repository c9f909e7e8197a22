// Beagle training: the early (inverse block) and late (simulation) masks cell by cell, and on a
// tiny target a short two-stage run that lowers both stages' losses, resumes to the weights of an
// uninterrupted run, and leaves a checkpoint that loads for its target only.
#include "common/train/beagle_trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "common/drafters/beagle/beagle_model.h"
#include "common/model/model_runner.h"
#include "common/model/transformer.h"
#include "common/train/beagle_masks.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_model.h"
#include "tests/train/tiny_distill.h"

namespace specula {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// n_w by brute force: the n = eps (mod k) with n < p <= n + k.
int64_t WindowStart(int64_t p, int64_t k, int64_t eps) {
  for (int64_t n = eps - 10 * k; n < p + k; n += k) {
    if (n < p && p <= n + k) return n;
  }
  ADD_FAILURE() << "no window for p " << p;
  return 0;
}

struct MaskCase {
  int64_t T, k;
};
constexpr MaskCase kMaskCases[] = {{1, 1}, {7, 1}, {9, 3}, {13, 5}, {20, 4}, {6, 8}};

TEST(BeagleMasksTest, WindowOfMatchesDefinition) {
  for (const auto [T, k] : kMaskCases) {
    for (int64_t eps = 0; eps < k; ++eps) {
      for (int64_t p = 0; p < T; ++p) {
        const BeagleWindow w = BeagleWindowOf(p, k, eps);
        EXPECT_EQ(w.start, WindowStart(p, k, eps)) << "p " << p << " k " << k << " eps " << eps;
        EXPECT_EQ(w.index, p - w.start);
        EXPECT_GE(w.index, 1);
        EXPECT_LE(w.index, k);
      }
    }
  }
}

TEST(BeagleMasksTest, EarlyMaskHidesExactlyTheWindowsKeys) {
  for (const auto [T, k] : kMaskCases) {
    for (int64_t eps = 0; eps < k; ++eps) {
      const std::vector<uint8_t> mask = BeagleEarlyMask(T, k, eps);
      ASSERT_EQ(mask.size(), static_cast<size_t>(T * T));
      for (int64_t p = 0; p < T; ++p) {
        const int64_t n = WindowStart(p, k, eps);
        for (int64_t j = 0; j < T; ++j) {
          // Visible: exactly the true keys up to the window start (never j >= p).
          EXPECT_EQ(mask[p * T + j], j <= n ? 1 : 0)
              << "T " << T << " k " << k << " eps " << eps << " p " << p << " j " << j;
          if (j >= p) {
            EXPECT_EQ(mask[p * T + j], 0);
          }
        }
      }
    }
  }
}

TEST(BeagleMasksTest, LateMaskExposesThePredictedKeysOfEarlierSteps) {
  for (const auto [T, k] : kMaskCases) {
    for (int64_t eps = 0; eps < k; ++eps) {
      const std::vector<uint8_t> early = BeagleEarlyMask(T, k, eps);
      for (int64_t step = 1; step <= k; ++step) {
        const std::vector<uint8_t> mask = BeagleLateMask(T, k, eps, step);
        ASSERT_EQ(mask.size(), static_cast<size_t>(T * 2 * T));
        std::vector<int64_t> queries;
        for (int64_t p = 0; p < T; ++p) {
          const int64_t n = WindowStart(p, k, eps);
          const bool queried = p - n == step && n >= 0;
          if (queried) queries.push_back(p);
          int64_t predicted = 0;
          for (int64_t j = 0; j < T; ++j) {
            const uint8_t true_key = mask[p * 2 * T + j], predicted_key = mask[p * 2 * T + T + j];
            // The same true keys as in the early stage; predicted keys n_w + 1 .. p - 1.
            EXPECT_EQ(true_key, queried ? early[p * T + j] : 0)
                << "T " << T << " k " << k << " eps " << eps << " step " << step << " p " << p;
            EXPECT_EQ(predicted_key, queried && j > n && j < p ? 1 : 0)
                << "T " << T << " k " << k << " eps " << eps << " step " << step << " p " << p
                << " j " << j;
            predicted += predicted_key;
          }
          if (queried) {
            EXPECT_EQ(predicted, step - 1);
          }
        }
        EXPECT_EQ(BeagleStepQueries(T, k, eps, step), queries);
      }
    }
  }
}

constexpr int kRecords = 64;

class BeagleTrainerTest : public ::testing::Test {
 protected:
  // A tiny target directory and a self-distillation dataset of its greedy continuations.
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    auto prompts = WriteTinyTargetAndDistill(Target(), Distill(), kRecords, 40);
    ASSERT_TRUE(prompts.ok()) << prompts.status();
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string Target() { return dir_->File("target"); }
  static std::string Distill() { return dir_->File("distill.bin"); }

  static BeagleTrainOptions Options(const std::string& out) {
    BeagleTrainOptions o;
    o.target_dir = Target();
    o.distill_path = Distill();
    o.out_dir = out;
    o.batch_size = 4;
    o.val_records = 4;
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

TempDir* BeagleTrainerTest::dir_ = nullptr;

TEST_F(BeagleTrainerTest, ShortRunLowersBothStagesLosses) {
  TempDir out;
  BeagleTrainOptions o = Options(out.File("beagle"));
  o.lr.total_steps = 160;
  o.eval_every = 160;
  auto result = TrainBeagle(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->finished);
  EXPECT_EQ(result->steps_done, 160);
  EXPECT_EQ(result->early_steps, 80);
  EXPECT_LT(result->early_last_loss, result->early_first_loss - 0.2)
      << "early: first " << result->early_first_loss << " last " << result->early_last_loss;
  EXPECT_LT(result->late_last_loss, result->late_first_loss)
      << "late: first " << result->late_first_loss << " last " << result->late_last_loss;
  // The late stage starts where the early one left off, not from scratch.
  EXPECT_LT(result->late_first_loss, result->early_first_loss);
  ASSERT_EQ(result->val_top1.size(), 5u);
  for (double a : result->val_top1) {
    EXPECT_GE(a, 0.0);
    EXPECT_LE(a, 1.0);
  }
  EXPECT_TRUE(std::isfinite(result->val_early_loss));
  EXPECT_TRUE(std::isfinite(result->val_late_loss));
  EXPECT_GT(result->tokens_seen, 160 * 4 * 40);
  EXPECT_TRUE(fs::exists(out.File("beagle/config.json")));
  EXPECT_TRUE(fs::exists(out.File("beagle/model.safetensors")));
  EXPECT_TRUE(fs::exists(out.File("beagle/checkpoint/optimizer.pt")));
}

TEST_F(BeagleTrainerTest, ResumeEqualsUninterruptedAndCheckpointLoadsForItsTargetOnly) {
  TempDir out;
  BeagleTrainOptions full = Options(out.File("full"));
  full.lr.total_steps = 12;  // 6 early + 6 late
  ASSERT_TRUE(TrainBeagle(full).ok());
  BeagleTrainOptions part = full;
  part.out_dir = out.File("part");
  part.max_steps_this_run = 5;
  for (int64_t expected : {5, 10}) {
    auto r = TrainBeagle(part);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->finished);
    EXPECT_EQ(r->steps_done, expected);
  }
  auto last = TrainBeagle(part);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(last->finished);

  auto a = LoadBeagleDir(out.File("full"), TinyModelConfig());
  auto b = LoadBeagleDir(out.File("part"), TinyModelConfig());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  auto pb = (*b)->named_parameters();
  for (const auto& p : (*a)->named_parameters()) {
    EXPECT_TRUE(torch::allclose(p.value(), pb[p.key()], 1e-5, 1e-6)) << p.key();
  }
  auto ckpt = LoadBeagleDir(out.File("part/checkpoint"), TinyModelConfig());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_TRUE(torch::equal((*ckpt)->q_proj->weight, (*b)->q_proj->weight));
  // Another target (other hidden size / layer count) is refused.
  ModelConfig other = TinyModelConfig();
  other.num_hidden_layers = 3;
  auto refused = LoadBeagleDir(out.File("part"), other);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);

  // A changed shape cannot resume the checkpoint.
  BeagleTrainOptions changed = part;
  changed.max_steps_this_run = 0;
  changed.intermediate_size = 48;
  changed.lr.total_steps = 20;
  auto mismatch = TrainBeagle(changed);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_THAT(mismatch.status().message(), HasSubstr("config differs"));
}

TEST_F(BeagleTrainerTest, BadOptionsAreReported) {
  TempDir out;
  BeagleTrainOptions o = Options(out.File("x"));
  o.sim_steps = 6;
  EXPECT_THAT(TrainBeagle(o).status().message(), HasSubstr("sim_steps"));
  o = Options(out.File("x"));
  o.early_fraction = 1.5;
  EXPECT_THAT(TrainBeagle(o).status().message(), HasSubstr("early_fraction"));
  o = Options(out.File("x"));
  o.distill_path = out.File("missing.bin");
  EXPECT_EQ(TrainBeagle(o).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace specula
