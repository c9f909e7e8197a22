// Decoder-only transformer hyperparameters, read from a Hugging Face config.json.
// Torch-free: services and tools read configs without pulling in LibTorch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/util/status.h"

namespace specula {

enum class Architecture { kLlama, kQwen2, kQwen3, kMistral };

std::string_view ArchitectureName(Architecture arch);

// rope_scaling as in HF: only "llama3" (Llama-3.1+) and "linear" change the frequencies here.
struct RopeScaling {
  std::string type;  // "" = none, "llama3", "linear"
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Architecture arch = Architecture::kLlama;
  std::string model_type = "llama";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // Qwen2 (q/k/v only); Llama's attention_bias also sets o_bias.
  bool o_bias = false;
  bool qk_norm = false;  // Qwen3: RMSNorm over head_dim on q and k before RoPE.
  std::optional<int64_t>
      sliding_window;  // Mistral: attend to at most this many previous positions.
  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;
  std::string torch_dtype = "float32";

  // INVALID_ARGUMENT naming the field for missing/ill-typed/inconsistent values,
  // UNIMPLEMENTED for an architecture we do not serve.
  static StatusOr<ModelConfig> FromJson(std::string_view json, std::string_view source_name);
  static StatusOr<ModelConfig> FromFile(const std::string& path);
  // HF-compatible config.json text (what training writes next to the weights).
  std::string ToJson() const;

  // Checks internal consistency (head counts divide, sizes positive).
  Status Validate(std::string_view source_name) const;

  int64_t num_parameters() const;
};

}  // namespace specula
