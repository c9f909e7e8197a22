// SpecFormer config, network and checkpoint: shapes, the slot attention mask, round trips and
// clear errors for bad checkpoints.
#include "common/drafters/specformer/specformer_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "common/drafters/specformer/specformer_config.h"
#include "common/model/checkpoint.h"
#include "common/util/mapped_file.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_model.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

SpecFormerConfig Config(const ModelConfig& target = TinyModelConfig(), bool causal = false) {
  SpecFormerConfig c = SpecFormerConfig::ForTarget(target, /*draft_len=*/4);
  c.causal_draft = causal;
  c.target_model = "tiny";
  return c;
}

std::shared_ptr<SpecFormerImpl> Module(const SpecFormerConfig& config, uint64_t seed = 1) {
  const ModelConfig target = TinyModelConfig();
  auto m = std::make_shared<SpecFormerImpl>(config, target);
  m->InitWeights(seed);
  return m;
}

TEST(SpecFormerConfigTest, DefaultsFollowTheTarget) {
  ModelConfig target = TinyModelConfig();
  target.num_hidden_layers = 6;
  SpecFormerConfig c = SpecFormerConfig::ForTarget(target);
  EXPECT_EQ(c.hidden_layers, (std::vector<int64_t>{0, 3, 5, 6}));
  EXPECT_EQ(c.draft_len, 8);
  EXPECT_EQ(c.num_attention_heads, target.num_attention_heads);
  EXPECT_EQ(c.num_key_value_heads, target.num_key_value_heads);
  EXPECT_EQ(c.intermediate_size, target.intermediate_size);
  EXPECT_FALSE(c.causal_draft);
  EXPECT_TRUE(c.Validate("c").ok());
}

TEST(SpecFormerConfigTest, JsonRoundTrip) {
  SpecFormerConfig c = Config();
  c.causal_draft = true;
  c.pending_token = true;
  c.hidden_layers = {0, 2};
  auto back = SpecFormerConfig::FromJson(c.ToJson(), "x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), c.ToJson());
  EXPECT_THAT(c.ToJson(), HasSubstr("\"kind\": \"specformer\""));
}

TEST(SpecFormerConfigTest, BadJsonNamesTheField) {
  auto not_drafter = SpecFormerConfig::FromJson(TinyModelConfig().ToJson(), "cfg.json");
  ASSERT_FALSE(not_drafter.ok());
  EXPECT_THAT(not_drafter.status().message(), HasSubstr("'kind'"));
  auto wrong_kind = SpecFormerConfig::FromJson(R"({"kind": "medusa"})", "cfg.json");
  ASSERT_FALSE(wrong_kind.ok());
  EXPECT_THAT(wrong_kind.status().message(), HasSubstr("medusa"));
  std::string text = Config().ToJson();
  text.replace(text.find("\"draft_len\""), 11, "\"draft_lenX\"");
  auto missing = SpecFormerConfig::FromJson(text, "cfg.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("'draft_len'"));
  SpecFormerConfig bad = Config();
  bad.hidden_layers = {0, 7};
  EXPECT_THAT(bad.Validate("c").message(), HasSubstr("hidden layer 7"));
}

TEST(SpecFormerConfigTest, CheckTargetNamesTheMismatch) {
  const SpecFormerConfig c = Config();
  ModelConfig other = TinyModelConfig();
  EXPECT_TRUE(c.CheckTarget(other).ok());
  other.vocab_size = 80;
  EXPECT_THAT(c.CheckTarget(other).message(), HasSubstr("vocab_size 64"));
  other = TinyModelConfig();
  other.hidden_size = 48;
  EXPECT_THAT(c.CheckTarget(other).message(), HasSubstr("hidden_size"));
  other = TinyModelConfig();
  other.num_hidden_layers = 3;
  EXPECT_THAT(c.CheckTarget(other).message(), HasSubstr("num_hidden_layers"));
}

TEST(SpecFormerConfigTest, ParameterCountsMatchTheModule) {
  for (bool pending : {false, true}) {
    SpecFormerConfig c = Config();
    c.pending_token = pending;
    auto m = Module(c);
    int64_t total = 0;
    for (const auto& p : m->parameters()) total += p.numel();
    EXPECT_EQ(total, c.shared_parameters() + c.draft_len * c.per_slot_parameters()) << pending;
  }
}

// An old config.json (no "pending_token") loads as the paper's network.
TEST(SpecFormerConfigTest, PendingTokenDefaultsToOff) {
  std::string text = Config().ToJson();
  const size_t at = text.find("\"pending_token\"");
  ASSERT_NE(at, std::string::npos);
  text.erase(at, text.find('\n', at) - at + 1);
  auto c = SpecFormerConfig::FromJson(text, "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->pending_token);
}

// With pending_token, row t's output depends on token t + 1 (and only row t's: the context
// attention is causal, so earlier rows do not see it).
TEST(SpecFormerModelTest, PendingTokenChangesOnlyItsOwnAndLaterRows) {
  const ModelConfig target = TinyModelConfig();
  auto lm = MakeTinyModel(target, 2);
  SpecFormerConfig config = Config();
  config.pending_token = true;
  auto m = Module(config);
  m->SetTargetWeights(lm->model->embed_tokens->weight, lm->model->norm->weight,
                      lm->lm_head_weight(), target.rms_norm_eps);
  torch::NoGradGuard no_grad;
  const int64_t T = 6, d = target.hidden_size;
  std::vector<torch::Tensor> hidden(4, torch::randn({T, d}));
  auto next = torch::tensor(std::vector<int64_t>{3, 9, 4, 1, 5, 7});
  auto other = next.clone();
  other[3] = 11;
  auto in = m->DenseContextInputs(1, T);
  auto a = m->Context(m->Hook(hidden, next), in, nullptr);
  auto b = m->Context(m->Hook(hidden, other), in, nullptr);
  EXPECT_TRUE(torch::equal(a.narrow(0, 0, 3), b.narrow(0, 0, 3)));
  for (int64_t t = 3; t < T; ++t) EXPECT_FALSE(torch::allclose(a[t], b[t])) << t;
  EXPECT_THROW(m->Hook(hidden, torch::Tensor()), c10::Error);
}

TEST(SpecFormerModelTest, Shapes) {
  const ModelConfig target = TinyModelConfig();
  auto lm = MakeTinyModel(target, 2);
  auto m = Module(Config());
  m->SetTargetWeights(lm->model->embed_tokens->weight, lm->model->norm->weight,
                      lm->lm_head_weight(), target.rms_norm_eps);
  torch::NoGradGuard no_grad;
  const int64_t B = 2, T = 5, d = target.hidden_size;
  std::vector<torch::Tensor> hidden(4, torch::randn({B * T, d}));
  auto x = m->Hook(hidden, torch::Tensor());
  EXPECT_EQ(x.sizes(), (std::vector<int64_t>{B * T, d}));
  auto c = m->Context(x, m->DenseContextInputs(B, T), nullptr);
  EXPECT_EQ(c.sizes(), (std::vector<int64_t>{B * T, d}));
  auto s = m->Slots(c);
  EXPECT_EQ(s.sizes(), (std::vector<int64_t>{B * T, 4, d}));
  EXPECT_EQ(m->Logits(s).sizes(), (std::vector<int64_t>{B * T, 4, target.vocab_size}));
}

// Serving (no autograd, CPU float32: each sequence's slots as one block attended in place by the
// paged kernel, the small-row matmul) computes what training (MaskedAttention, F::linear) does.
class SpecFormerSlotsTest : public ::testing::TestWithParam<bool> {};  // param: causal slots

TEST_P(SpecFormerSlotsTest, ServingSlotsEqualTheTrainingPath) {
  const ModelConfig target = TinyModelConfig();
  auto lm = MakeTinyModel(target, 2);
  auto m = Module(Config(target, GetParam()));
  m->SetTargetWeights(lm->model->embed_tokens->weight, lm->model->norm->weight,
                      lm->lm_head_weight(), target.rms_norm_eps);
  for (int64_t M : {1, 3, 17}) {
    auto c = torch::randn({M, target.hidden_size});
    torch::Tensor served, served_logits;
    {
      torch::NoGradGuard no_grad;
      served = m->Slots(c);
      served_logits = m->Logits(served);
    }
    auto trained = m->Slots(c);
    ASSERT_TRUE(trained.requires_grad());  // the training path really ran
    EXPECT_TRUE(torch::allclose(served, trained.detach(), 1e-5, 1e-5)) << "M " << M;
    EXPECT_TRUE(torch::allclose(served_logits, m->Logits(trained).detach(), 1e-4, 1e-4))
        << "M " << M;
  }
}

// Asking for the first n slots returns exactly those of the full forward, on the serving path
// (where causal slots compute only n) and the training path.
TEST_P(SpecFormerSlotsTest, FirstSlotsEqualThoseOfTheFullForward) {
  const ModelConfig target = TinyModelConfig();
  auto m = Module(Config(target, GetParam()));
  auto c = torch::randn({5, target.hidden_size});
  for (bool grad : {false, true}) {
    torch::AutoGradMode mode(grad);
    auto full = m->Slots(c);
    for (int64_t n : {1, 2, 3, 4, 9}) {
      auto part = m->Slots(c, n);
      const int64_t expect = std::min<int64_t>(n, 4);
      ASSERT_EQ(part.size(1), expect);
      EXPECT_TRUE(torch::allclose(part, full.narrow(1, 0, expect), 1e-5, 1e-5))
          << "n " << n << " grad " << grad;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Slots, SpecFormerSlotsTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Causal" : "Bidirectional"; });

// Changing only the last slot's input (its positional FFN bias) must reach slot 0 through
// bidirectional slot attention, and must not under the causal option.
void CheckLastSlotVisibility(bool causal) {
  auto m = Module(Config(TinyModelConfig(), causal));
  torch::NoGradGuard no_grad;
  const int64_t d = TinyModelConfig().hidden_size, l = 4;
  auto c = torch::randn({3, d});
  auto before = m->Slots(c);
  m->positional_ffn->bias.narrow(0, (l - 1) * d, d).add_(torch::randn({d}));
  auto after = m->Slots(c);
  const double slot0_change = (after.select(1, 0) - before.select(1, 0)).abs().max().item<double>();
  const double last_change =
      (after.select(1, l - 1) - before.select(1, l - 1)).abs().max().item<double>();
  EXPECT_GT(last_change, 1e-3);
  if (causal) {
    EXPECT_EQ(slot0_change, 0.0) << "causal slot 0 sees slot l_d-1";
    for (int64_t j = 0; j < l - 1; ++j) {
      EXPECT_TRUE(torch::equal(after.select(1, j), before.select(1, j))) << "slot " << j;
    }
  } else {
    EXPECT_GT(slot0_change, 1e-5) << "bidirectional slot 0 does not see slot l_d-1";
  }
}

TEST(SpecFormerModelTest, BidirectionalSlot0SeesLastSlot) { CheckLastSlotVisibility(false); }
TEST(SpecFormerModelTest, CausalSlot0DoesNotSeeLastSlot) { CheckLastSlotVisibility(true); }

// The context attention is causal: a later position does not change an earlier output.
TEST(SpecFormerModelTest, ContextAttentionIsCausal) {
  auto m = Module(Config());
  torch::NoGradGuard no_grad;
  const int64_t T = 6, d = TinyModelConfig().hidden_size;
  auto x = torch::randn({T, d});
  auto a = m->Context(x, m->DenseContextInputs(1, T), nullptr);
  auto y = x.clone();
  y[T - 1].add_(1.0);
  auto b = m->Context(y, m->DenseContextInputs(1, T), nullptr);
  EXPECT_TRUE(torch::allclose(a.narrow(0, 0, T - 1), b.narrow(0, 0, T - 1)));
  EXPECT_FALSE(torch::allclose(a[T - 1], b[T - 1]));
}

TEST(SpecFormerCheckpointTest, RoundTrip) {
  TempDir dir;
  auto m = Module(Config(TinyModelConfig(), /*causal=*/true), 7);
  ASSERT_TRUE(SaveSpecFormerDir(*m, dir.path().string()).ok());
  auto loaded = LoadSpecFormerDir(dir.path().string(), TinyModelConfig());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->config().ToJson(), m->config().ToJson());
  auto a = m->named_parameters();
  auto b = (*loaded)->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& p : a) {
    ASSERT_TRUE(b.contains(p.key())) << p.key();
    EXPECT_TRUE(torch::equal(p.value(), b[p.key()])) << p.key();
  }
}

TEST(SpecFormerCheckpointTest, BadCheckpointsGiveClearErrors) {
  TempDir dir;
  const std::string path = dir.path().string();
  auto missing = LoadSpecFormerDir(path, TinyModelConfig());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);

  // A target model directory is not a drafter checkpoint.
  ASSERT_TRUE(WriteStringToFile(dir.File("config.json"), TinyModelConfig().ToJson()).ok());
  auto not_drafter = LoadSpecFormerDir(path, TinyModelConfig());
  ASSERT_FALSE(not_drafter.ok());
  EXPECT_THAT(not_drafter.status().message(), HasSubstr("kind"));

  auto m = Module(Config());
  ASSERT_TRUE(SaveSpecFormerDir(*m, path).ok());
  ModelConfig other = TinyModelConfig();
  other.vocab_size = 80;
  auto wrong_vocab = LoadSpecFormerDir(path, other);
  ASSERT_FALSE(wrong_vocab.ok());
  EXPECT_EQ(wrong_vocab.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong_vocab.status().message(), HasSubstr("vocab_size"));
  other = TinyModelConfig();
  other.hidden_size = 48;
  other.head_dim = 12;
  auto wrong_hidden = LoadSpecFormerDir(path, other);
  ASSERT_FALSE(wrong_hidden.ok());
  EXPECT_THAT(wrong_hidden.status().message(), HasSubstr("hidden_size"));

  // Weights missing a tensor.
  std::map<std::string, at::Tensor> weights;
  for (const auto& p : m->named_parameters()) {
    if (p.key() != "downsampler.weight") weights[p.key()] = p.value();
  }
  ASSERT_TRUE(SaveSafetensorsFile(dir.File("model.safetensors"), weights).ok());
  auto no_tensor = LoadSpecFormerDir(path, TinyModelConfig());
  ASSERT_FALSE(no_tensor.ok());
  EXPECT_THAT(no_tensor.status().message(), HasSubstr("downsampler.weight"));
}

}  // namespace
}  // namespace specula
