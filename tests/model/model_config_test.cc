#include "common/model/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace specula {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Shapes of the public checkpoints (trimmed to the fields we read plus some we ignore).
constexpr char kLlama31[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";

constexpr char kLlama2[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_size": 4096,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "torch_dtype": "float16",
  "vocab_size": 32000
})";

constexpr char kQwen25[] = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

constexpr char kQwen3[] = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_size": 1024,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "use_sliding_window": false,
  "vocab_size": 151936
})";

constexpr char kMistral[] = R"({
  "architectures": ["MistralForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "intermediate_size": 14336,
  "max_position_embeddings": 32768,
  "model_type": "mistral",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "sliding_window": 4096,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "vocab_size": 32000
})";

ModelConfig ParseOk(std::string_view json) {
  auto c = ModelConfig::FromJson(json, "config.json");
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : ModelConfig();
}

Status ParseError(std::string_view json) {
  auto c = ModelConfig::FromJson(json, "cfg/config.json");
  EXPECT_FALSE(c.ok());
  return c.status();
}

TEST(ModelConfigTest, Llama31WithRopeScalingAndEosList) {
  const ModelConfig c = ParseOk(kLlama31);
  EXPECT_EQ(c.arch, Architecture::kLlama);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.num_hidden_layers, 32);
  EXPECT_EQ(c.num_attention_heads, 32);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);  // hidden / heads
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(128001, 128008, 128009));
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(ModelConfigTest, Llama2Defaults) {
  const ModelConfig c = ParseOk(kLlama2);
  EXPECT_EQ(c.num_key_value_heads, 32);  // defaults to num_attention_heads (no GQA)
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);  // default
  EXPECT_EQ(c.rope_scaling.type, "");       // null rope_scaling
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(2));  // eos as a plain int
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.torch_dtype, "float16");
}

TEST(ModelConfigTest, Qwen2HasQkvBiasAndTiedEmbeddings) {
  const ModelConfig c = ParseOk(kQwen25);
  EXPECT_EQ(c.arch, Architecture::kQwen2);
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_EQ(c.num_attention_heads, 14);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 64);  // 896 / 14
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.tie_word_embeddings);
  // sliding_window is only used with use_sliding_window=true.
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_THAT(c.eos_token_ids, ElementsAre(151643));
}

TEST(ModelConfigTest, Qwen3ExplicitHeadDimAndQkNorm) {
  const ModelConfig c = ParseOk(kQwen3);
  EXPECT_EQ(c.arch, Architecture::kQwen3);
  EXPECT_EQ(c.head_dim, 128);  // explicit, not 1024 / 16 = 64
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);  // an integer in the JSON
  EXPECT_THAT(c.eos_token_ids, ElementsAre(151645));
}

TEST(ModelConfigTest, MistralSlidingWindow) {
  const ModelConfig c = ParseOk(kMistral);
  EXPECT_EQ(c.arch, Architecture::kMistral);
  EXPECT_EQ(c.model_type, "mistral");
  ASSERT_TRUE(c.sliding_window.has_value());
  EXPECT_EQ(*c.sliding_window, 4096);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_FALSE(c.qkv_bias);

  std::string no_window = kMistral;
  no_window.replace(no_window.find("\"sliding_window\": 4096"), 22, "\"sliding_window\": null");
  EXPECT_FALSE(ParseOk(no_window).sliding_window.has_value());
}

TEST(ModelConfigTest, LlamaAttentionBiasSetsQkvAndOBias) {
  std::string json = kLlama2;
  json.replace(json.find("\"bos_token_id\""), 0, "\"attention_bias\": true, ");
  const ModelConfig c = ParseOk(json);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.o_bias);
}

TEST(ModelConfigTest, NoEosAndNoBos) {
  const ModelConfig c = ParseOk(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2})");
  EXPECT_THAT(c.eos_token_ids, IsEmpty());
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.torch_dtype, "float32");
}

TEST(ModelConfigTest, LinearRopeScaling) {
  std::string json = kLlama2;
  json.replace(json.find("\"rope_scaling\": null"), 20,
               R"("rope_scaling": {"type": "linear", "factor": 2.0})");
  const ModelConfig c = ParseOk(json);
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 2.0);
}

// --- Errors name the field (and the source). ---

TEST(ModelConfigErrorTest, MissingRequiredField) {
  std::string json = kLlama2;
  json.replace(json.find("\"hidden_size\": 4096,"), 20, "");
  Status s = ParseError(json);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "cfg/config.json: missing required field 'hidden_size'");

  Status no_type = ParseError(R"({"vocab_size": 10})");
  EXPECT_EQ(no_type.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(no_type.message(), HasSubstr("'model_type'"));
}

TEST(ModelConfigErrorTest, UnsupportedModelType) {
  Status s = ParseError(R"({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768})");
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("cfg/config.json"), HasSubstr("'gpt2'")));
}

TEST(ModelConfigErrorTest, HeadsNotDivisibleByKvHeads) {
  std::string json = kLlama31;
  json.replace(json.find("\"num_key_value_heads\": 8"), 24, "\"num_key_value_heads\": 5");
  Status s = ParseError(json);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      s.message(),
      "cfg/config.json: num_attention_heads (32) must be a multiple of num_key_value_heads (5)");
}

TEST(ModelConfigErrorTest, NotJson) {
  for (std::string_view text : {"{\"model_type\": ", "[1, 2, 3]", "", "null"}) {
    Status s = ParseError(text);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_EQ(s.message(), "cfg/config.json: not a valid JSON object") << text;
  }
}

TEST(ModelConfigErrorTest, IllTypedAndInvalidFields) {
  struct Case {
    std::string from, to, field;
    StatusCode code = StatusCode::kInvalidArgument;
  };
  const std::vector<Case> cases = {
      {"\"hidden_size\": 4096", "\"hidden_size\": \"4096\"", "'hidden_size' must be an integer"},
      {"\"hidden_size\": 4096", "\"hidden_size\": 4096.5", "'hidden_size' must be an integer"},
      {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": \"small\"", "'rms_norm_eps' must be a number"},
      {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": 0", "'rms_norm_eps' must be positive"},
      {"\"tie_word_embeddings\": false", "\"tie_word_embeddings\": 0",
       "'tie_word_embeddings' must be a boolean"},
      {"\"vocab_size\": 128256", "\"vocab_size\": 0", "'vocab_size' must be positive, got 0"},
      {"\"num_hidden_layers\": 32", "\"num_hidden_layers\": -1",
       "'num_hidden_layers' must be positive"},
      {"\"eos_token_id\": [128001, 128008, 128009]", "\"eos_token_id\": [128001, \"x\"]",
       "'eos_token_id' must hold integers"},
      {"\"eos_token_id\": [128001, 128008, 128009]", "\"eos_token_id\": \"</s>\"",
       "'eos_token_id' must be an integer or a list"},
      {"\"rope_scaling\": {", "\"rope_scaling\": 3, \"unused\": {",
       "'rope_scaling' must be an object"},
      {"\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"", "'yarn' is not supported",
       StatusCode::kUnimplemented},
      // An explicit odd head_dim cannot be rotated in pairs.
      {"\"hidden_size\": 4096,", "\"hidden_size\": 4096, \"head_dim\": 127,",
       "head_dim must be even"},
  };
  for (const Case& c : cases) {
    std::string json = kLlama31;
    const size_t at = json.find(c.from);
    ASSERT_NE(at, std::string::npos) << c.from;
    json.replace(at, c.from.size(), c.to);
    Status s = ParseError(json);
    EXPECT_EQ(s.code(), c.code) << c.to;
    EXPECT_THAT(s.message(), AllOf(HasSubstr("cfg/config.json"), HasSubstr(c.field))) << c.to;
  }
}

TEST(ModelConfigErrorTest, Qwen2SlidingWindowIsUnimplemented) {
  std::string json = kQwen25;
  json.replace(json.find("\"use_sliding_window\": false"), 27, "\"use_sliding_window\": true");
  Status s = ParseError(json);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_THAT(s.message(), HasSubstr("use_sliding_window"));
}

// --- ToJson writes what FromJson reads back. ---

void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.model_type, b.model_type);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.intermediate_size, b.intermediate_size);
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_DOUBLE_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_DOUBLE_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_DOUBLE_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  EXPECT_DOUBLE_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
  EXPECT_DOUBLE_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings,
            b.rope_scaling.original_max_position_embeddings);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.o_bias, b.o_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.bos_token_id, b.bos_token_id);
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids);
  EXPECT_EQ(a.torch_dtype, b.torch_dtype);
  EXPECT_EQ(a.num_parameters(), b.num_parameters());
}

TEST(ModelConfigTest, ToJsonRoundTrip) {
  std::string llama_bias = kLlama2;
  llama_bias.replace(llama_bias.find("\"bos_token_id\""), 0, "\"attention_bias\": true, ");
  for (const std::string& json :
       {std::string(kLlama31), std::string(kLlama2), llama_bias, std::string(kQwen25),
        std::string(kQwen3), std::string(kMistral)}) {
    const ModelConfig original = ParseOk(json);
    const std::string written = original.ToJson();
    auto reread = ModelConfig::FromJson(written, "written");
    ASSERT_TRUE(reread.ok()) << reread.status() << "\n" << written;
    SCOPED_TRACE(written);
    ExpectSameConfig(original, *reread);
    // Stable: writing again gives the same text.
    EXPECT_EQ(reread->ToJson(), written);
  }
}

TEST(ModelConfigTest, ToJsonFromCode) {
  ModelConfig c;
  c.arch = Architecture::kQwen3;
  c.model_type = "qwen3";
  c.vocab_size = 100;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;  // != 32 / 4
  c.qk_norm = true;
  c.tie_word_embeddings = true;
  c.eos_token_ids = {3, 4};
  c.rope_scaling.type = "linear";
  c.rope_scaling.factor = 4.0;
  ASSERT_TRUE(c.Validate("code").ok());
  auto back = ModelConfig::FromJson(c.ToJson(), "code");
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameConfig(c, *back);
  EXPECT_THAT(c.ToJson(), HasSubstr("\"Qwen3ForCausalLM\""));
}

TEST(ModelConfigTest, NumParametersByHand) {
  ModelConfig c = ParseOk(R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
      "num_key_value_heads": 2, "tie_word_embeddings": true})");
  // head_dim 2: q 8x8, k/v 8x4 each, o 8x8, mlp 3*8*16, 2 norms of 8, biases 8+4+4.
  const int64_t per_layer = 64 + 2 * 32 + 64 + 384 + 16 + 16;
  EXPECT_EQ(c.num_parameters(), 2 * per_layer + 10 * 8 + 8);
  c.tie_word_embeddings = false;
  EXPECT_EQ(c.num_parameters(), 2 * per_layer + 2 * 10 * 8 + 8);
}

TEST(ModelConfigTest, FromFile) {
  const fs::path dir =
      fs::temp_directory_path() / ("specula_model_config_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "config.json").string();
  { std::ofstream(path) << kQwen3; }
  auto c = ModelConfig::FromFile(path);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);

  { std::ofstream(path) << "{\"model_type\": \"llama\"}"; }
  auto bad = ModelConfig::FromFile(path);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr(path));  // errors name the file

  auto missing = ModelConfig::FromFile((dir / "absent.json").string());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("absent.json"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace specula
