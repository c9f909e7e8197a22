// SpecDec config and model: the config round-trips through JSON and names bad fields; the
// training forward (dense) gives the serving forward's (paged, incremental) slot logits for the
// same prefix; revealed (glanced) slots change the inputs; checkpoints round-trip; the encoder
// initialises from a token-only LM of its geometry.
#include "common/drafters/specdec/specdec_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <random>

#include "common/drafters/specdec/specdec_config.h"
#include "common/drafters/specdec/specdec_drafter.h"
#include "common/model/model_runner.h"
#include "tests/drafters/random_specdec.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/tiny_model.h"

namespace specula {
namespace {

using ::testing::HasSubstr;

SpecDecConfig Config() { return TinySpecDecConfig(TinyModelConfig(), 3, 2, 4); }

std::shared_ptr<SpecDecImpl> Module(uint64_t seed = 1) {
  return RandomSpecDecModule(Config(), TinyModelConfig(), seed);
}

std::vector<int32_t> RandomTokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % TinyModelConfig().vocab_size);
  return t;
}

TEST(SpecDecConfigTest, JsonRoundTrip) {
  const SpecDecConfig c = Config();
  auto back = SpecDecConfig::FromJson(c.ToJson(), "x");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->hidden_size, c.hidden_size);
  EXPECT_EQ(back->encoder_layers, c.encoder_layers);
  EXPECT_EQ(back->decoder_layers, c.decoder_layers);
  EXPECT_EQ(back->num_slots, c.num_slots);
  EXPECT_EQ(back->geometry.num_attention_heads, c.geometry.num_attention_heads);
  EXPECT_EQ(back->geometry.num_key_value_heads, c.geometry.num_key_value_heads);
  EXPECT_EQ(back->geometry.head_dim, c.geometry.head_dim);
  EXPECT_EQ(back->geometry.intermediate_size, c.geometry.intermediate_size);
  EXPECT_DOUBLE_EQ(back->geometry.rms_norm_eps, c.geometry.rms_norm_eps);
  EXPECT_EQ(back->target.vocab_size, TinyModelConfig().vocab_size);
  EXPECT_EQ(back->ToJson(), c.ToJson());
  // The parameter count in the config is the module's.
  auto m = Module();
  int64_t n = 0;
  for (const auto& p : m->parameters()) n += p.numel();
  EXPECT_EQ(c.parameters(), n);
}

TEST(SpecDecConfigTest, BadFieldsAreNamed) {
  auto expect_invalid = [](const std::string& json, const std::string& field) {
    auto c = SpecDecConfig::FromJson(json, "cfg.json");
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(c.status().message(), HasSubstr(field));
  };
  nlohmann::json good = nlohmann::json::parse(Config().ToJson());
  for (const char* field : {"hidden_size", "encoder_layers", "decoder_layers", "num_slots",
                            "num_attention_heads", "head_dim"}) {
    nlohmann::json j = good;
    j[field] = 0;
    expect_invalid(j.dump(), field);
    j.erase(field);
    expect_invalid(j.dump(), field);
  }
  nlohmann::json other = good;
  other["kind"] = "specformer";
  expect_invalid(other.dump(), "specformer");
  expect_invalid("[1, 2]", "cfg.json");
  // Another target: a clear error naming what differs.
  ModelConfig target = TinyModelConfig();
  target.vocab_size += 1;
  EXPECT_THAT(Config().CheckTarget(target).message(), HasSubstr("vocab_size"));
}

// The trainer's dense forward gives the same slot logits as the serving drafter (incremental
// encoder cache + paged decoder) for the same prefix, for several split points at once.
TEST(SpecDecModelTest, TrainLogitsEqualServingLogits) {
  auto m = Module();
  const std::vector<int32_t> tokens = RandomTokens(24, 7);
  const std::vector<int64_t> splits = {0, 5, 13, 23};
  torch::Tensor train;
  {
    torch::NoGradGuard no_grad;
    const int64_t S = static_cast<int64_t>(splits.size()), k = Config().num_slots;
    train = m->TrainLogits(
        torch::tensor(std::vector<int64_t>(tokens.begin(), tokens.end())).view({1, -1}),
        torch::tensor(splits).view({1, S}), torch::full({1, S, k}, -1, torch::kLong));
  }
  auto drafter = SpecDecDrafter::Create(Module(), {.kv = {.block_size = 4, .num_blocks = 64}});
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  for (size_t s = 0; s < splits.size(); ++s) {
    const SeqId seq = 10 + static_cast<SeqId>(s);
    ASSERT_TRUE((*drafter)->AddSequence(seq, {}).ok());
    // Ragged observation: the prefix in two chunks.
    const int64_t n = splits[s] + 1, first = (n + 1) / 2;
    ASSERT_TRUE(
        (*drafter)
            ->Observe({{.seq = seq,
                        .tokens = std::vector<int32_t>(tokens.begin(), tokens.begin() + first)}})
            .ok());
    ASSERT_TRUE((*drafter)
                    ->Observe({{.seq = seq,
                                .tokens = std::vector<int32_t>(tokens.begin() + first,
                                                               tokens.begin() + n)}})
                    .ok());
    auto serving = (*drafter)->SlotLogits(seq);
    ASSERT_TRUE(serving.ok()) << serving.status();
    EXPECT_TRUE(torch::allclose(*serving, train[0][s], 1e-3, 1e-3))
        << "split " << splits[s] << ": max diff "
        << (*serving - train[0][s]).abs().max().item<float>();
  }
}

TEST(SpecDecModelTest, RevealedSlotsChangeOnlyTheirInputs) {
  auto m = Module();
  torch::NoGradGuard no_grad;
  const torch::Tensor slot = torch::arange(4, torch::kLong);
  const torch::Tensor masked = m->SlotInputs(slot, torch::full({4}, -1, torch::kLong));
  const torch::Tensor glanced = m->SlotInputs(slot, torch::tensor({-1, 7, -1, 3}, torch::kLong));
  EXPECT_TRUE(torch::equal(masked[0], glanced[0]));
  EXPECT_TRUE(torch::equal(masked[2], glanced[2]));
  EXPECT_FALSE(torch::equal(masked[1], glanced[1]));
  const torch::Tensor embed = m->encoder->model->embed_tokens->weight;
  EXPECT_TRUE(torch::allclose(glanced[1], embed[7] + m->slot_embedding[1]));
  EXPECT_TRUE(torch::allclose(masked[3], m->mask_embedding + m->slot_embedding[3]));
}

TEST(SpecDecModelTest, CheckpointRoundTrip) {
  TempDir dir;
  auto m = Module(3);
  ASSERT_TRUE(SaveSpecDecDir(*m, dir.path().string()).ok());
  auto back = LoadSpecDecDir(dir.path().string(), TinyModelConfig());
  ASSERT_TRUE(back.ok()) << back.status();
  auto a = m->named_parameters(), b = (*back)->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& p : a) EXPECT_TRUE(torch::equal(p.value(), b[p.key()])) << p.key();
  ModelConfig other = TinyModelConfig();
  other.num_hidden_layers += 1;
  auto wrong = LoadSpecDecDir(dir.path().string(), other);
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("num_hidden_layers"));
  auto missing = LoadSpecDecDir(dir.File("nope"), TinyModelConfig());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// A 2-layer LM of the encoder's geometry (3 layers): embedding, final norm and layers 0-1 come
// from it; layer 2, the decoder and the slot embeddings keep their init. A mismatched or untied
// LM is refused, naming the field.
TEST(SpecDecModelTest, EncoderInitialisesFromATokenOnlyLm) {
  TempDir dir;
  const ModelConfig lm_config = Config().LayerConfig(TinyModelConfig(), 2);
  torch::manual_seed(11);
  auto lm = std::make_shared<CausalLMImpl>(lm_config);
  lm->InitWeights(11);
  ASSERT_TRUE(SaveModelDir(*lm, lm_config, dir.File("lm")).ok());
  auto m = Module(4);
  std::map<std::string, torch::Tensor> before;
  for (const auto& p : m->named_parameters()) before[p.key()] = p.value().clone();
  auto copied = m->InitEncoderFrom(dir.File("lm"));
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ(*copied, 2);
  auto lm_params = lm->named_parameters();
  int64_t from_lm = 0;
  for (const auto& p : m->named_parameters()) {
    const std::string& name = p.key();
    const std::string inner = name.rfind("encoder.", 0) == 0 ? name.substr(8) : "";
    const bool shared =
        !inner.empty() && lm_params.contains(inner) && inner.rfind("model.layers.2.", 0) != 0;
    if (shared) {
      ++from_lm;
      EXPECT_TRUE(torch::equal(p.value(), lm_params[inner])) << name;
    } else {
      EXPECT_TRUE(torch::equal(p.value(), before[name])) << name << " changed";
    }
  }
  EXPECT_EQ(from_lm, static_cast<int64_t>(lm_params.size()));

  ModelConfig wide = lm_config;
  wide.hidden_size *= 2;
  wide.head_dim *= 2;
  auto wide_lm = std::make_shared<CausalLMImpl>(wide);
  ASSERT_TRUE(SaveModelDir(*wide_lm, wide, dir.File("wide")).ok());
  auto refused = m->InitEncoderFrom(dir.File("wide"));
  ASSERT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("hidden_size"));

  ModelConfig untied = lm_config;
  untied.tie_word_embeddings = false;
  auto untied_lm = std::make_shared<CausalLMImpl>(untied);
  ASSERT_TRUE(SaveModelDir(*untied_lm, untied, dir.File("untied")).ok());
  auto refused_untied = m->InitEncoderFrom(dir.File("untied"));
  ASSERT_EQ(refused_untied.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused_untied.status().message(), HasSubstr("tie_word_embeddings"));

  EXPECT_FALSE(m->InitEncoderFrom(dir.File("missing")).ok());
}

}  // namespace
}  // namespace specula
