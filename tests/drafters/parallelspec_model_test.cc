// ParallelSpec config, group-wise mask layout, network and checkpoint: the structured layout equals
// a dense reference written from the paper's rules, the group-wise forward (shared + per-row keys)
// equals a dense masked forward over all (k+1)T rows, round trips, and clear errors.
#include "common/drafters/parallelspec/parallelspec_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "common/drafters/parallelspec/parallelspec_config.h"
#include "common/drafters/parallelspec/parallelspec_layout.h"
#include "common/model/rope.h"
#include "common/model/safetensors.h"
#include "common/util/mapped_file.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_model.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

ParallelSpecConfig Config(bool features = true, int64_t k = 3) {
  ParallelSpecConfig c = ParallelSpecConfig::ForTarget(TinyModelConfig(), k);
  c.use_target_features = features;
  c.target.model = "tiny";
  return c;
}

std::shared_ptr<ParallelSpecImpl> Module(const ParallelSpecConfig& config, uint64_t seed = 1) {
  auto m = std::make_shared<ParallelSpecImpl>(config, TinyModelConfig());
  m->InitWeights(seed);
  torch::NoGradGuard no_grad;
  for (auto& p : m->named_parameters()) {
    if (p.key().find("norm") == std::string::npos) p.value().mul_(10.0);
  }
  return m;
}

// The paper's rules, written directly over (group, mask) pairs in group-major order.
TEST(ParallelSpecLayoutTest, DenseMaskEqualsThePapersRules) {
  for (int64_t T : {1, 2, 5}) {
    for (int64_t k : {1, 2, 4}) {
      const std::vector<uint8_t> mask = ParallelSpecDenseMask(T, k);
      const int64_t n = T * (k + 1);
      ASSERT_EQ(static_cast<int64_t>(mask.size()), n * n);
      for (int64_t q = 0; q < n; ++q) {
        const int64_t qg = q / (k + 1), qi = q % (k + 1);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t kg = j / (k + 1), ki = j % (k + 1);
          bool want;
          if (ki == 0) {
            want = kg <= qg;  // real rows: causal, seen by every row of later or same groups
          } else {
            want = qi > 0 && kg == qg && ki <= qi;  // masks: own group, up to itself
          }
          EXPECT_EQ(mask[q * n + j], want ? 1 : 0)
              << "T " << T << " k " << k << " row (" << qg << "," << qi << ") key (" << kg << ","
              << ki << ")";
        }
      }
    }
  }
  EXPECT_EQ(ParallelSpecPosition({.group = 4, .mask = 2}), 6);
  EXPECT_EQ(ParallelSpecDepth({.group = 4, .mask = 2}), 3);
}

TEST(ParallelSpecConfigTest, JsonRoundTripAndDefaults) {
  for (bool features : {true, false}) {
    ParallelSpecConfig c = Config(features);
    EXPECT_EQ(c.feature_layer, TinyModelConfig().num_hidden_layers);
    auto back = ParallelSpecConfig::FromJson(c.ToJson(), "config.json");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->ToJson(), c.ToJson());
    EXPECT_EQ(back->use_target_features, features);
    // Parameter count = the module's parameters.
    auto m = Module(c);
    int64_t n = 0;
    for (const auto& p : m->parameters()) n += p.numel();
    EXPECT_EQ(n, c.parameters());
  }
}

TEST(ParallelSpecConfigTest, BadJsonNamesTheField) {
  const std::string good = Config().ToJson();
  auto with = [&](const char* key, nlohmann::json value) {
    auto j = nlohmann::json::parse(good);
    if (value.is_null()) {
      j.erase(key);
    } else {
      j[key] = value;
    }
    return ParallelSpecConfig::FromJson(j.dump(), "ps.json").status();
  };
  EXPECT_THAT(with("num_mask_tokens", 0).message(), HasSubstr("num_mask_tokens"));
  EXPECT_THAT(with("num_mask_tokens", nullptr).message(), HasSubstr("num_mask_tokens"));
  EXPECT_THAT(with("feature_layer", 99).message(), HasSubstr("feature_layer"));
  EXPECT_THAT(with("use_target_features", "yes").message(), HasSubstr("use_target_features"));
  EXPECT_THAT(with("kind", "beagle").message(), HasSubstr("kind"));
  EXPECT_THAT(with("head_dim", -2).message(), HasSubstr("head_dim"));
  ModelConfig other = TinyModelConfig();
  other.vocab_size = 80;
  EXPECT_THAT(Config().CheckTarget(other).message(), HasSubstr("vocab_size"));
}

// The group-wise forward (shared real keys + per-row own-group keys) equals one dense masked
// attention over every (k+1)T row under ParallelSpecDenseMask.
TEST(ParallelSpecModelTest, GroupForwardEqualsTheDenseMaskedForward) {
  for (bool features : {true, false}) {
    const int64_t k = 3, T = 6, B = 2;
    auto m = Module(Config(features, k), 3);
    auto target = MakeTinyModel(TinyModelConfig(), 2);
    m->SetTargetWeights(target->model->embed_tokens->weight, target->lm_head_weight());
    torch::NoGradGuard no_grad;
    const int64_t d = TinyModelConfig().hidden_size;
    auto f = torch::randn({B, T, d});
    auto tokens = torch::randint(0, TinyModelConfig().vocab_size, {B, T}, torch::kLong);
    auto x_real = m->RealInputs(f, tokens);  // [B, T, d]
    // Every group, in order.
    auto groups = torch::arange(T, torch::kLong).repeat({B, 1});
    auto valid = torch::ones({B, T}, torch::kBool);
    auto out = m->GroupForward(x_real, groups, valid);

    // Dense: rows in group-major order, positions r + i, the dense mask.
    const int64_t n = T * (k + 1);
    std::vector<int64_t> pos;
    for (const auto& row : ParallelSpecRows(T, k)) pos.push_back(ParallelSpecPosition(row));
    auto mask_x = m->MaskInputs();
    std::vector<torch::Tensor> rows;
    for (int64_t r = 0; r < T; ++r) {
      rows.push_back(x_real.narrow(1, r, 1));
      rows.push_back(mask_x.view({1, k, d}).expand({B, k, d}));
    }
    auto x = torch::cat(rows, 1).reshape({B * n, d});
    auto cs = m->RopeFor(torch::tensor(pos, torch::kLong).repeat({B}));
    AttentionInputs in;
    in.batch = B;
    in.max_q = n;
    in.max_k = n;
    in.cos = cs.first;
    in.sin = cs.second;
    std::vector<uint8_t> dense = ParallelSpecDenseMask(T, k);
    in.mask = torch::from_blob(dense.data(), {n, n}, torch::kUInt8)
                  .to(torch::kBool)
                  .view({1, 1, 1, n, n});
    auto h = m->Layer(x, in, nullptr).view({B, T, k + 1, d});
    EXPECT_TRUE(torch::allclose(out.real, h.select(2, 0), 1e-4, 1e-4)) << features;
    EXPECT_TRUE(torch::allclose(out.masks, h.narrow(2, 1, k), 1e-4, 1e-4)) << features;
  }
}

TEST(ParallelSpecCheckpointTest, RoundTripWithoutTheTargetsWeights) {
  for (bool features : {true, false}) {
    TempDir dir;
    auto m = Module(Config(features), 7);
    ASSERT_TRUE(SaveParallelSpecDir(*m, dir.path().string()).ok());
    auto loaded = LoadParallelSpecDir(dir.path().string(), TinyModelConfig());
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ((*loaded)->config().ToJson(), m->config().ToJson());
    auto a = m->named_parameters();
    auto b = (*loaded)->named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (const auto& p : a) {
      ASSERT_TRUE(b.contains(p.key())) << p.key();
      EXPECT_TRUE(torch::equal(p.value(), b[p.key()])) << p.key();
      EXPECT_EQ(p.key().find("embed_tokens"), std::string::npos) << p.key();
      EXPECT_EQ(p.key().find("lm_head"), std::string::npos) << p.key();
    }
    EXPECT_EQ(a.contains("fusion.weight"), features);
  }
}

TEST(ParallelSpecCheckpointTest, BadCheckpointsGiveClearErrors) {
  TempDir dir;
  const std::string path = dir.path().string();
  auto missing = LoadParallelSpecDir(path, TinyModelConfig());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(WriteStringToFile(dir.File("config.json"), TinyModelConfig().ToJson()).ok());
  auto not_drafter = LoadParallelSpecDir(path, TinyModelConfig());
  ASSERT_FALSE(not_drafter.ok());
  EXPECT_THAT(not_drafter.status().message(), HasSubstr("kind"));
  // Weights of the token-only variant under a config that wants the fusion layer.
  auto token_only = Module(Config(/*features=*/false));
  ASSERT_TRUE(SaveParallelSpecDir(*token_only, path).ok());
  ASSERT_TRUE(WriteStringToFile(dir.File("config.json"), Config(true).ToJson()).ok());
  auto mismatched = LoadParallelSpecDir(path, TinyModelConfig());
  ASSERT_FALSE(mismatched.ok());
  EXPECT_THAT(mismatched.status().message(), HasSubstr("fusion"));
}

}  // namespace
}  // namespace specula
